//! Stress test: 8 streams × 10,000 small tasks with random cross-stream dependencies and
//! transfers, checked against a sequential model of the same program. Every stream keeps an
//! order-sensitive running value (`c = 3c + k`, wrapping), so a lost, duplicated or reordered
//! write changes the result.

use arrayjit::prelude::*;
use arrayjit::runtime::Routine;

const STREAMS: usize = 8;
const TASKS_PER_STREAM: usize = 10_000;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

enum Op {
    Inc { s: usize, k: i64 },
    Transfer { dst: usize, src: usize },
    Wait { waiter: usize, on: usize },
}

fn program(seed: u64) -> Vec<Op> {
    let mut rng = Rng(seed);
    let mut ops = Vec::with_capacity(STREAMS * TASKS_PER_STREAM);
    for _ in 0..STREAMS * TASKS_PER_STREAM {
        let s = rng.below(STREAMS);
        let other = (s + 1 + rng.below(STREAMS - 1)) % STREAMS;
        ops.push(match rng.below(20) {
            0..=1 => Op::Transfer { dst: s, src: other },
            2 => Op::Wait {
                waiter: s,
                on: other,
            },
            _ => Op::Inc {
                s,
                k: rng.below(16) as i64,
            },
        });
    }
    ops
}

fn model(ops: &[Op]) -> Vec<i64> {
    let mut c = vec![0i64; STREAMS];
    for op in ops {
        match *op {
            Op::Inc { s, k } => c[s] = c[s].wrapping_mul(3).wrapping_add(k),
            Op::Transfer { dst, src } => c[dst] = c[dst].wrapping_add(c[src]),
            Op::Wait { .. } => {}
        }
    }
    c
}

struct PerStream {
    inc: Routine,
    absorb: Routine,
    export: Routine,
    out: Tnode,
}

fn run(backend_name: &str, ops: &[Op]) -> Vec<i64> {
    let b = arrayjit::backend(backend_name).unwrap();
    let c = Tnode::new(Prec::I64, &[], &["c"]).unwrap();
    c.update_memory_mode(
        MemoryMode::OnDevice(Sharing::PerStream),
        "stress: per-stream counter",
    )
    .unwrap();
    let three = Tnode::new(Prec::I64, &[], &["three"]).unwrap();
    three.host().set_values(&[3.0]).unwrap();
    let ks = Tnode::new(Prec::I64, &[16], &["ks"]).unwrap();
    ks.host()
        .set_values(&(0..16).map(f64::from).collect::<Vec<_>>())
        .unwrap();
    let k_index = StaticSymbol::new("k", 16);
    let k = Tnode::new(Prec::I64, &[], &["k"]).unwrap();
    let init = Assignments::Fetch {
        array: c.clone(),
        op: FetchOp::Constant(0.0),
    };
    let inc = Assignments::Fetch {
        array: k.clone(),
        op: FetchOp::Slice {
            batch: k_index.clone(),
            sliced: ks.clone(),
        },
    }
    .then(Assignments::Accum {
        initialize_neutral: false,
        accum: BinOp::Arg2,
        lhs: c.clone(),
        rhs: AccumRhs::Ternop(
            TernOp::Fma,
            Operand::Node(c.clone()),
            Operand::Node(three.clone()),
            Operand::Node(k.clone()),
        ),
        projections: Projections::pointwise(&[], 3),
    });
    let absorb = Assignments::Accum {
        initialize_neutral: false,
        accum: BinOp::Add,
        lhs: c.clone(),
        rhs: AccumRhs::Unop(UnOp::Identity, Operand::Merge(c.clone())),
        projections: Projections::pointwise(&[], 1),
    };
    let outs: Vec<Tnode> = (0..STREAMS)
        .map(|s| {
            let t = Tnode::new(Prec::I64, &[], &[&format!("out{s}")]).unwrap();
            t.update_memory_mode(
                MemoryMode::Hosted(MemoryType::Nonconstant),
                "stress: result",
            )
            .unwrap();
            t
        })
        .collect();
    let exports: Vec<Assignments> = outs
        .iter()
        .map(|o| Assignments::pointwise_unop(o, UnOp::Identity, &c))
        .collect();
    let export_names: Vec<String> = (0..STREAMS).map(|s| format!("export{s}")).collect();
    let mut batch: Vec<(&str, &Assignments)> =
        vec![("init", &init), ("inc", &inc), ("absorb", &absorb)];
    batch.extend(export_names.iter().map(String::as_str).zip(exports.iter()));
    let codes = b
        .compile(CompileRequest::batch(&batch).bindings(std::slice::from_ref(&k_index)))
        .unwrap();
    let device = b.get_device(0).unwrap();
    let streams: Vec<PerStream> = (0..STREAMS)
        .map(|s| {
            let stream = device.new_stream().unwrap();
            let r_init = Context::new(&stream).link(&codes[0]).unwrap();
            r_init.run().unwrap();
            let r_inc = r_init.context().link(&codes[1]).unwrap();
            let r_abs = r_inc.context().link(&codes[2]).unwrap();
            let r_exp = r_abs.context().link(&codes[3 + s]).unwrap();
            PerStream {
                inc: r_inc,
                absorb: r_abs,
                export: r_exp,
                out: outs[s].clone(),
            }
        })
        .collect();
    for op in ops {
        match *op {
            Op::Inc { s, k } => {
                streams[s].inc.set_static(&k_index, k).unwrap();
                streams[s].inc.run().unwrap();
            }
            Op::Transfer { dst, src } => {
                let (d, s) = (&streams[dst], &streams[src]);
                d.absorb
                    .context()
                    .device_to_device(&c, MergeBufferUse::Copy, s.absorb.context())
                    .unwrap();
                d.absorb.run().unwrap();
            }
            Op::Wait { waiter, on } => {
                let event = streams[on].inc.context().stream().all_work();
                streams[waiter].inc.context().will_wait_for(&event).unwrap();
            }
        }
    }
    streams
        .iter()
        .map(|p| {
            p.export.run().unwrap();
            p.export.context().stream().await_work().unwrap();
            match p.out.host().array().unwrap().storage() {
                arrayjit::ir::ndarray::Storage::I64(v) => v[0],
                other => panic!("expected i64 storage, got {other:?}"),
            }
        })
        .collect()
}

#[test]
fn eight_streams_ten_thousand_tasks_each_match_the_sequential_model() {
    let ops = program(0x9e3779b97f4a7c15);
    let expected = model(&ops);
    let first = run("multicore_cc", &ops);
    assert_eq!(
        first, expected,
        "multicore_cc disagrees with the sequential model"
    );
    let second = run("multicore_cc", &ops);
    assert_eq!(first, second, "two runs differ");
}

#[test]
fn the_same_program_on_the_sync_scheduler() {
    let ops: Vec<Op> = program(42).into_iter().take(8_000).collect();
    assert_eq!(run("sync_cc", &ops), model(&ops));
}
