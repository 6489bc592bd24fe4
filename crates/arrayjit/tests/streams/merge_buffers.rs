//! Merge buffers and device-to-device copies across streams: the copy waits for its writer, a
//! streamed source is never written by a later copy, the buffer is reused when large enough,
//! and a mismatch is caught at link time.

use super::*;

#[test]
fn device_to_device_waits_for_the_writer_and_fills_the_merge_buffer() {
    for b in backends_with_streams().into_iter().skip(1) {
        device_to_device_on(&b);
    }
}

fn device_to_device_on(b: &Backend) {
    let dev = b.get_device(0).unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let x = hosted_input(&[4], "x", &[1.0, 2.0, 3.0, 4.0]);
    let g = Tnode::new(Prec::F32, &[4], &["g"]).unwrap();
    g.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test: gradient")
        .unwrap();
    let acc = hosted_input(&[4], "acc", &[0.0; 4]);
    let slow_producer = b
        .compile(CompileRequest::routine(
            "produce",
            &Assignments::pointwise_unop(&g, UnOp::Exp, &x),
        ))
        .unwrap();
    let merge = add_merge_buffer(&acc, &g);
    let consumer = b
        .compile(CompileRequest::routine("consume", &merge))
        .unwrap();
    let src = Context::new(&s1).link(&slow_producer).unwrap();
    let dst = Context::new(&s2).link(&consumer).unwrap();
    assert_eq!(dst.context().merge_node(), Some(&g));
    // Keep the source stream busy so the copy must wait for the producer.
    s1.schedule_task(|| {
        std::thread::sleep(Duration::from_millis(30));
        Ok(())
    })
    .unwrap();
    src.run().unwrap();
    dst.context()
        .device_to_device(&g, MergeBufferUse::Copy, src.context())
        .unwrap();
    dst.run().unwrap();
    let expected: Vec<f64> = [1f32, 2., 3., 4.].iter().map(|v| v.exp() as f64).collect();
    let got = acc.host().get_values().unwrap();
    for (e, g) in expected.iter().zip(&got) {
        assert!((e - g).abs() < 1e-5, "{expected:?} vs {got:?}");
    }
    // A context whose code reads g's merge cannot take another node's copy.
    let err = dst
        .context()
        .device_to_device(&x, MergeBufferUse::Copy, src.context())
        .unwrap_err();
    assert!(err.to_string().contains("merge"), "{err}");
    // Streaming: no copy, the routine reads the source's array.
    dst.context()
        .device_to_device(&g, MergeBufferUse::StreamingFor(&dst), src.context())
        .unwrap();
    let got = acc.host().get_values().unwrap();
    assert!((got[0] - 2.0 * expected[0]).abs() < 1e-5, "{got:?}");
    // Into the destination's own array (`No`): a context without one is a typed error naming
    // the node; one with its own array gets the source's values.
    let err = dst
        .context()
        .device_to_device(&g, MergeBufferUse::No, src.context())
        .unwrap_err();
    assert!(
        matches!(err, arrayjit::Error::NodeNotInContext { .. }) && err.to_string().contains('g'),
        "{err}"
    );
    let out = hosted_output(&[4], "out");
    let reader = b
        .compile(CompileRequest::routine(
            "read_g",
            &Assignments::pointwise_unop(&out, UnOp::Identity, &g),
        ))
        .unwrap();
    // The destination's own g, written first with other values (-x).
    let other_values = b
        .compile(CompileRequest::routine(
            "negate",
            &Assignments::pointwise_unop(&g, UnOp::Neg, &x),
        ))
        .unwrap();
    let negated = Context::new(&s2).link(&other_values).unwrap();
    negated.run().unwrap();
    let own = negated.context().link(&reader).unwrap();
    own.context()
        .device_to_device(&g, MergeBufferUse::No, src.context())
        .unwrap();
    own.run().unwrap();
    let got = out.host().get_values().unwrap();
    for (e, g) in expected.iter().zip(&got) {
        assert!((e - g).abs() < 1e-5, "{expected:?} vs {got:?}");
    }
}

/// Regression (issue 22, defect 1): a `Copy` into a stream's merge buffer after a
/// `StreamingFor` must land in the stream's own buffer, never in the streamed source's array.
#[test]
fn a_copy_after_streaming_never_writes_the_streamed_source() {
    for b in backends_with_streams() {
        let name = b.name().to_string();
        let dev = b.get_device(0).unwrap();
        let (s1, s2, s3) = (
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
            dev.new_stream().unwrap(),
        );
        let xa = hosted_input(&[4], "xa", &[1.0, 2.0, 3.0, 4.0]);
        let xc = hosted_input(&[4], "xc", &[-10.0, -20.0, -30.0, -40.0]);
        let g = Tnode::new(Prec::F32, &[4], &["g"]).unwrap();
        g.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test: gradient")
            .unwrap();
        let acc = hosted_input(&[4], "acc", &[0.0; 4]);
        let out = hosted_output(&[4], "out");
        let copy_of = |x: &Tnode| Assignments::pointwise_unop(&g, UnOp::Identity, x);
        let produce_a = b
            .compile(CompileRequest::routine("produce_a", &copy_of(&xa)))
            .unwrap();
        let produce_c = b
            .compile(CompileRequest::routine("produce_c", &copy_of(&xc)))
            .unwrap();
        let merge = add_merge_buffer(&acc, &g);
        let consume = b
            .compile(CompileRequest::routine("consume", &merge))
            .unwrap();
        let read_g = b
            .compile(CompileRequest::routine(
                "read_g",
                &Assignments::pointwise_unop(&out, UnOp::Identity, &g),
            ))
            .unwrap();
        let ra = Context::new(&s1).link(&produce_a).unwrap();
        let rc = Context::new(&s3).link(&produce_c).unwrap();
        let cons = Context::new(&s2).link(&consume).unwrap();
        ra.run().unwrap();
        rc.run().unwrap();
        let dst = cons.context();
        dst.device_to_device(&g, MergeBufferUse::StreamingFor(&cons), ra.context())
            .unwrap();
        assert!(s2.debug_info().contains("streamed"), "{}", s2.debug_info());
        dst.device_to_device(&g, MergeBufferUse::Copy, rc.context())
            .unwrap();
        assert!(!s2.debug_info().contains("streamed"), "{}", s2.debug_info());
        cons.run().unwrap();
        assert_eq!(
            acc.host().get_values().unwrap(),
            vec![-9.0, -18.0, -27.0, -36.0],
            "{name}: streamed A, then copied C"
        );
        // A's own g still holds A's values.
        let read_a = ra.context().link(&read_g).unwrap();
        read_a.run().unwrap();
        assert_eq!(
            out.host().get_values().unwrap(),
            vec![1.0, 2.0, 3.0, 4.0],
            "{name}: A's array was overwritten through the merge buffer"
        );
    }
}

/// A run reading a streamed merge buffer is ordered after the source's later writes, like a
/// read of the source's array (the merge slot keeps the source's entry).
#[test]
fn runs_reading_a_streamed_merge_buffer_wait_for_the_source_writer() {
    for b in backends_with_streams() {
        let name = b.name().to_string();
        let dev = b.get_device(0).unwrap();
        let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
        let x = hosted_input(&[2], "x", &[1.0, 2.0]);
        let g = Tnode::new(Prec::F32, &[2], &["g"]).unwrap();
        g.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test: gradient")
            .unwrap();
        let acc = hosted_input(&[2], "acc", &[0.0; 2]);
        let produce = b
            .compile(CompileRequest::routine(
                "produce",
                &Assignments::pointwise_binop(&g, BinOp::Add, &x, &x),
            ))
            .unwrap();
        let merge = add_merge_buffer(&acc, &g);
        let consume = b
            .compile(CompileRequest::routine("consume", &merge))
            .unwrap();
        let src = Context::new(&s1).link(&produce).unwrap();
        let cons = Context::new(&s2).link(&consume).unwrap();
        src.run().unwrap();
        cons.context()
            .device_to_device(&g, MergeBufferUse::StreamingFor(&cons), src.context())
            .unwrap();
        // The source recomputes g after a delay; the next run of the consumer must see it.
        x.host().set_values(&[10.0, 20.0]).unwrap();
        s1.schedule_task(|| {
            std::thread::sleep(Duration::from_millis(30));
            Ok(())
        })
        .unwrap();
        src.run().unwrap();
        cons.run().unwrap();
        assert_eq!(acc.host().get_values().unwrap(), vec![22.0, 44.0], "{name}");
    }
}

/// `alloc_buffer ?old_buffer`: a stream's merge buffer is reused for any node that fits in it
/// (another size or precision included) and grows when one does not; the values are right
/// each time.
#[test]
fn the_merge_buffer_is_reused_when_large_enough() {
    for b in backends_with_streams() {
        let name = b.name().to_string();
        let dev = b.get_device(0).unwrap();
        let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
        // A node of `n` values on s1, and a consumer on s2 adding it from the merge buffer.
        let pair = |n: usize, label: &str| {
            let x = hosted_input(&[n], &format!("x{label}"), &vec![1.5; n]);
            let g = Tnode::new(Prec::F32, &[n], &[&format!("g{label}")]).unwrap();
            g.update_memory_mode(MemoryMode::OnDevice(Sharing::PerStream), "test")
                .unwrap();
            let acc = hosted_input(&[n], &format!("acc{label}"), &vec![0.0; n]);
            let produce = b
                .compile(CompileRequest::routine(
                    "produce",
                    &Assignments::pointwise_unop(&g, UnOp::Identity, &x),
                ))
                .unwrap();
            let merge = add_merge_buffer(&acc, &g);
            let consume = b
                .compile(CompileRequest::routine("consume", &merge))
                .unwrap();
            let src = Context::new(&s1).link(&produce).unwrap();
            src.run().unwrap();
            let dst = Context::new(&s2).link(&consume).unwrap();
            (g, acc, src, dst)
        };
        let (g4, acc4, src4, dst4) = pair(4, "4");
        let (g2, acc2, src2, dst2) = pair(2, "2");
        let (g8, acc8, src8, dst8) = pair(8, "8");
        let copy = |g: &Tnode, src: &Routine, dst: &Routine| {
            dst.context()
                .device_to_device(g, MergeBufferUse::Copy, src.context())
                .unwrap();
            dst.run().unwrap();
        };
        copy(&g4, &src4, &dst4);
        assert_eq!(acc4.host().get_values().unwrap(), vec![1.5; 4], "{name}");
        let used = dev.used_memory();
        copy(&g2, &src2, &dst2);
        assert_eq!(acc2.host().get_values().unwrap(), vec![1.5; 2], "{name}");
        assert_eq!(
            dev.used_memory(),
            used,
            "{name}: a smaller node reuses the buffer"
        );
        copy(&g4, &src4, &dst4);
        assert_eq!(acc4.host().get_values().unwrap(), vec![3.0; 4], "{name}");
        assert_eq!(dev.used_memory(), used, "{name}");
        copy(&g8, &src8, &dst8);
        assert_eq!(acc8.host().get_values().unwrap(), vec![1.5; 8], "{name}");
        s2.await_work().unwrap();
        let grown = dev.used_memory();
        copy(&g2, &src2, &dst2);
        assert_eq!(acc2.host().get_values().unwrap(), vec![3.0; 2], "{name}");
        assert_eq!(
            dev.used_memory(),
            grown,
            "{name}: the grown buffer is reused"
        );
    }
}

#[test]
fn merge_buffer_mismatch_is_caught_at_link_time() {
    let b = multicore();
    let s = b.get_device(0).unwrap().new_stream().unwrap();
    let g1 = hosted_input(&[2], "g1", &[1.0, 2.0]);
    let g2 = hosted_input(&[2], "g2", &[1.0, 2.0]);
    let acc = hosted_input(&[2], "acc2", &[0.0, 0.0]);
    let merge_of = |g: &Tnode| add_merge_buffer(&acc, g);
    let c1 = b
        .compile(CompileRequest::routine("m1", &merge_of(&g1)))
        .unwrap();
    let c2 = b
        .compile(CompileRequest::routine("m2", &merge_of(&g2)))
        .unwrap();
    let r1 = Context::new(&s).link(&c1).unwrap();
    let err = r1.context().link(&c2).unwrap_err();
    assert!(matches!(err, Error::MergeBuffer { .. }), "{err}");
}
