//! Property test of the host-synchronisation rules (reliability issue, item 11): random
//! sequences of routine runs, `to_host`, host reads and host writes over three copies of one
//! hosted node (two streams of one device, one stream of another) agree with a sequential model.

use arrayjit::prelude::*;
use arrayjit::runtime::{RuntimeConfig, backend_with_config};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    /// Run `v = 2·v + 1` in context `i`.
    Run(usize),
    /// `to_host` from context `i`.
    ToHost(usize),
    /// Read the host values.
    HostRead,
    /// Write the host values.
    HostWrite(i8),
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize).prop_map(Op::Run),
        1 => (0..3usize).prop_map(Op::ToHost),
        2 => Just(Op::HostRead),
        1 => any::<i8>().prop_map(Op::HostWrite),
    ]
}

/// The sequential model: the host value, each copy's value, which copies do not lag the host,
/// and the copy the host refreshes from when it is next read or written.
struct Model {
    host: f64,
    copies: [Option<f64>; 3],
    fresh: [bool; 3],
    pending: Option<usize>,
}

impl Model {
    fn refresh(&mut self) {
        if let Some(p) = self.pending.take() {
            self.host = self.copies[p].expect("a written copy");
        }
    }

    fn apply(&mut self, op: &Op) -> Option<f64> {
        match *op {
            Op::Run(i) => {
                if !self.fresh[i] || self.copies[i].is_none() {
                    self.refresh();
                    self.copies[i] = Some(self.host);
                }
                self.copies[i] = self.copies[i].map(|v| 2.0 * v + 1.0);
                self.fresh = [false; 3];
                self.fresh[i] = true;
                self.pending = Some(i);
                None
            }
            Op::ToHost(i) => {
                let v = self.copies[i]?;
                self.host = v;
                self.pending = None;
                self.fresh = [false; 3];
                self.fresh[i] = true;
                None
            }
            Op::HostRead => {
                self.refresh();
                Some(self.host)
            }
            Op::HostWrite(v) => {
                self.refresh();
                self.host = f64::from(v);
                self.fresh = [false; 3];
                None
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn item11_host_sync_agrees_with_a_sequential_model(
        ops in prop::collection::vec(arb_op(), 1..24),
        untouched_zeros in any::<bool>(),
    ) {
        let config = RuntimeConfig { num_devices: Some(2), ..RuntimeConfig::default() };
        let b = backend_with_config("multicore_cc", &config).unwrap();
        let v = Tnode::new(Prec::F64, &[2], &["v"]).unwrap();
        if untouched_zeros {
            // A host array made and never written (as an optimizer's moments are): linking
            // copies nothing, the new zero-filled arrays hold its values already.
            v.host().with_mut(|_| Ok(())).unwrap();
            prop_assert!(v.host().holds_initial_zeros());
        } else {
            v.host().set_values(&[0.0, 0.0]).unwrap();
        }
        let one = Tnode::new(Prec::F64, &[2], &["one"]).unwrap();
        one.host().set_values(&[1.0, 1.0]).unwrap();
        one.update_memory_mode(MemoryMode::Hosted(MemoryType::Constant), "test: constant").unwrap();
        let prog = Assignments::pointwise_binop(&v, BinOp::Add, &v, &v)
            .then(Assignments::pointwise_binop(&v, BinOp::Add, &v, &one));
        let code = b.compile(CompileRequest::routine("step", &prog)).unwrap();
        let (d0, d1) = (b.get_device(0).unwrap(), b.get_device(1).unwrap());
        let streams = [d0.new_stream().unwrap(), d0.new_stream().unwrap(), d1.new_stream().unwrap()];
        let routines: Vec<Routine> = streams
            .iter()
            .map(|s| Context::new(s).link(&code).unwrap())
            .collect();
        let mut model = Model { host: 0.0, copies: [None; 3], fresh: [false; 3], pending: None };
        // Linking gives every copy the host values.
        for i in 0..3 {
            model.copies[i] = Some(0.0);
            model.fresh[i] = true;
        }
        for op in &ops {
            let expected = model.apply(op);
            match *op {
                Op::Run(i) => routines[i].run().unwrap(),
                Op::ToHost(i) => routines[i].context().to_host(&v).unwrap(),
                Op::HostRead => {
                    let got = v.host().get_values().unwrap();
                    let want = expected.unwrap();
                    prop_assert_eq!(got, vec![want, want], "after {:?}", ops);
                }
                Op::HostWrite(x) => v.host().set_values(&[f64::from(x); 2]).unwrap(),
            }
        }
    }
}
