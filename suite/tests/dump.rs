//! The instance file format: a reader written from the format description decodes every instance back.

use suite::{Expect, Param, Size, param_offsets};

struct R<'a>(&'a [u8]);

impl R<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (h, t) = self.0.split_at(n);
        self.0 = t;
        h
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn str(&mut self) -> String {
        let n = self.u32() as usize;
        String::from_utf8(self.take(n).to_vec()).unwrap()
    }
    fn blob(&mut self) -> Vec<u8> {
        let n = self.u64() as usize;
        self.take(n).to_vec()
    }
}

#[test]
fn every_small_instance_round_trips() {
    for w in suite::all() {
        let inst = w.instance(Size::Small);
        let bytes = suite::dump::encode(&inst);
        let mut r = R(&bytes);
        assert_eq!(r.take(8), suite::dump::MAGIC);
        assert_eq!(r.str(), w.name);
        assert_eq!(r.str(), "small");
        assert_eq!(r.str(), w.ptx);
        assert_eq!(r.u32() as usize, inst.buffers.len());
        for b in &inst.buffers {
            assert_eq!(r.str(), b.name);
            assert_eq!(r.blob(), b.init);
            let kind = r.u8();
            match &b.expect {
                Expect::Ignore => assert_eq!(kind, 0),
                Expect::Exact { bytes, .. } => {
                    assert_eq!(kind, 1);
                    assert!(r.u8() <= 4);
                    assert_eq!(&r.blob(), bytes);
                }
                Expect::F32 { values, abs, rel } => {
                    assert_eq!(kind, 2);
                    assert_eq!(r.u32(), abs.to_bits());
                    assert_eq!(r.u32(), rel.to_bits());
                    assert_eq!(r.blob(), suite::f32_bytes(values));
                }
                Expect::U64AtLeast { count, min } => {
                    assert_eq!(kind, 3);
                    assert_eq!((r.u64(), r.u64()), (*count as u64, *min));
                }
            }
        }
        assert_eq!(r.u32() as usize, inst.launches.len());
        for l in &inst.launches {
            assert_eq!(r.str(), l.entry);
            let dims: Vec<u32> = (0..6).map(|_| r.u32()).collect();
            assert_eq!(dims[..3], l.grid);
            assert_eq!(dims[3..], l.block);
            assert_eq!(r.u32(), l.shared_bytes);
            assert_eq!(r.u32(), suite::params_size(&l.params));
            assert_eq!(r.u32() as usize, l.params.len());
            for (p, off) in l.params.iter().zip(param_offsets(&l.params)) {
                let (kind, o, size, value) = (r.u8(), r.u32(), r.u32(), r.u64());
                assert_eq!((o, size), (off, p.size()));
                match *p {
                    Param::Buffer(i) => assert_eq!((kind, value), (0, i as u64)),
                    _ => assert_eq!(Some(value), p.bits(&[])),
                }
            }
        }
        assert!(r.0.is_empty(), "{}: trailing bytes", w.name);
    }
}
