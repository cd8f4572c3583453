//! The destination's ready lines on a stream ([`super::super::ready`]): asked for, they come
//! (`hello`, then `prepared` or `fallback`) and the source sees them; not asked for (an older
//! source), nothing comes before the final answer; a source facing a silent (older)
//! destination sends it no `WAIT` frame.

use super::*;
use std::time::Instant;

fn live_manifest(gpu: &str) -> Manifest {
    Manifest {
        format: super::super::manifest::FORMAT.into(),
        version: super::super::format::VERSION,
        vmm_version: "0".into(),
        memory_mib: 2,
        cpus: 1,
        boot: super::super::manifest::BootKind::BareMetal,
        image: "t".into(),
        testdev: false,
        gpu: Some(gpu.into()),
        tsc_khz: 0,
        msrs: 0,
        state_bytes: 0,
        state_crc32: 0,
        ram_bytes: 2 << 20,
        ram_pages: 0,
        gpu_bytes: 0,
        gpu_crc32: 0,
        gpu_live: true,
        disks: Vec::new(),
    }
}

/// Polls `tx` until it hears the destination is ready (at most 5 s).
fn until_ready(tx: &mut Sender<'_>) -> Readiness {
    let t = Instant::now();
    loop {
        let r = tx.readiness(Duration::from_millis(20)).unwrap();
        if matches!(r, Readiness::Ready { .. }) || t.elapsed() > Duration::from_secs(5) {
            return r;
        }
    }
}

/// A source and a destination (`receive` on a thread) over a socket pair: the source's
/// readiness once a VRAM page went, and the destination's error (the stream is cut after).
fn asked_destination(gpu: &str) -> (Readiness, String) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let (a, b) = (Link::from(a), Link::from(b));
    let dest = std::thread::spawn(move || receive(&b, None).map(|_| ()).unwrap_err().to_string());
    let m = live_manifest(gpu);
    let mut tx = Sender::start(&a, &m).unwrap();
    tx.vram(0, 3, &[5; 4096]).unwrap();
    let r = until_ready(&mut tx);
    drop(tx);
    drop(a);
    (r, dest.join().unwrap())
}

#[test]
fn an_asked_destination_says_when_its_engine_is_ready() {
    let (r, e) = asked_destination("vram=2M");
    match r {
        Readiness::Ready {
            prepared: true,
            engine_us,
        } => assert!(engine_us < 5_000_000, "{engine_us}"),
        other => panic!("not ready: {other:?} (destination: {e})"),
    }
    // A GPU the destination does not prepare (a daemon's shared VRAM): `fallback` at once.
    let (r, _) = asked_destination("vram=2M,host=/nonexistent.sock");
    assert_eq!(
        r,
        Readiness::Ready {
            prepared: false,
            engine_us: 0
        }
    );
}

/// Runs `receive` on `frames` and returns everything it wrote back and its error.
fn lines_back(frames: &[(u32, Vec<u8>)]) -> (String, String) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let b = Link::from(b);
    let mut bytes = Vec::new();
    for (kind, payload) in frames {
        frame(&mut bytes, *kind, &[payload]).unwrap();
    }
    let mut a2 = a.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = a2.write_all(&bytes);
        let _ = a2.shutdown(std::net::Shutdown::Write);
    });
    let e = receive(&b, None).map(|_| ()).unwrap_err().to_string();
    drop(b);
    drop(writer.join());
    let mut back = String::new();
    let mut a = a;
    let _ = a.read_to_string(&mut back);
    (back, e)
}

#[test]
fn lines_go_only_to_a_source_that_asked_and_wait_frames_are_checked() {
    let m = |v: &str| {
        let mut m = live_manifest("vram=2M");
        m.vmm_version = v.into();
        serde_json::to_vec(&m).unwrap()
    };
    let asked = super::super::ready::asking("0");
    // An older source (no capability): nothing before the final answer; its WAIT frame is
    // an unknown frame.
    let (back, e) = lines_back(&[(MANIFEST, m("0")), (WAIT, vec![])]);
    assert_eq!(back, "");
    assert!(e.contains("unexpected frame 7"), "{e}");
    // Asked: hello first; after WAIT, the ready line (the sim engine is made at once).
    let (back, e) = lines_back(&[(MANIFEST, m(&asked)), (WAIT, vec![]), (99, vec![])]);
    assert!(
        back.starts_with("ready/1 hello\nready/1 prepared "),
        "{back:?}"
    );
    assert!(e.contains("unexpected frame 99"), "{e}");
    // A WAIT frame with a payload is refused.
    let (_, e) = lines_back(&[(MANIFEST, m(&asked)), (WAIT, vec![1])]);
    assert!(e.contains("unexpected frame 7"), "{e}");
    // Without VRAM pre-copy the capability is ignored.
    let mut plain = live_manifest("vram=2M");
    plain.gpu_live = false;
    plain.vmm_version = asked;
    let (back, _) = lines_back(&[(MANIFEST, serde_json::to_vec(&plain).unwrap())]);
    assert_eq!(back, "");
}

#[test]
fn a_silent_older_destination_gets_no_wait_frame() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let a = Link::from(a);
    let mut tx = Sender::start(&a, &live_manifest("vram=2M")).unwrap();
    assert_eq!(
        tx.readiness(Duration::from_millis(20)).unwrap(),
        Readiness::Waiting { hello: false }
    );
    drop(tx);
    drop(a);
    let mut r = BufReader::new(b);
    let (kind, len) = read_header(&mut r).unwrap();
    assert_eq!(kind, MANIFEST);
    let text = read_payload(&mut r, len, MAX_MANIFEST, "manifest").unwrap();
    let m = Manifest::parse(&text).unwrap();
    assert!(
        super::super::ready::asked(&m.vmm_version),
        "{}",
        m.vmm_version
    );
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{} bytes after the manifest", rest.len());
    // A destination that answers out of turn (a ready line before hello) is an error.
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let a = Link::from(a);
    let mut b = b;
    let mut tx = Sender::start(&a, &live_manifest("vram=2M")).unwrap();
    b.write_all(b"ready/1 prepared 5\n").unwrap();
    let e = tx.readiness(Duration::from_millis(20)).unwrap_err();
    assert!(e.to_string().contains("out of order"), "{e}");
}

/// A destination slower than the rounds (its engine ready 150 ms after the source's `WAIT`):
/// the source hears `hello`, sends one `WAIT`, is told to wait (its rounds would run on) until
/// the ready line comes, and only then is ready; the frames the destination read are the
/// manifest, the rounds' frames and that one `WAIT`.
#[test]
fn a_source_waits_for_a_slow_destination() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let a = Link::from(a);
    let dest = std::thread::spawn(move || {
        let mut w = b.try_clone().unwrap();
        let mut r = BufReader::new(b);
        let mut kinds = Vec::new();
        let (kind, len) = read_header(&mut r).unwrap();
        kinds.push(kind);
        read_payload(&mut r, len, MAX_MANIFEST, "manifest").unwrap();
        w.write_all(b"ready/1 hello\n").unwrap();
        loop {
            let (kind, len) = read_header(&mut r).unwrap();
            kinds.push(kind);
            read_payload(&mut r, len, MAX_VRAM_FRAME, "frame").unwrap();
            if kind == WAIT {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(150));
        w.write_all(b"ready/1 prepared 150000\n").unwrap();
        // What the source sends after (a round while it waited), until it closes.
        while let Ok((kind, len)) = read_header(&mut r) {
            kinds.push(kind);
            read_payload(&mut r, len, MAX_VRAM_FRAME, "frame").unwrap();
        }
        kinds
    });
    let mut tx = Sender::start(&a, &live_manifest("vram=2M")).unwrap();
    tx.vram(0, 0, &[1; 4096]).unwrap();
    let t = Instant::now();
    let mut waits = 0;
    let ready = loop {
        match tx.readiness(Duration::from_millis(10)).unwrap() {
            Readiness::Waiting { hello } => {
                assert!(hello || waits < 50, "no hello");
                waits += 1;
                // A round while waiting.
                tx.vram(1, 1, &[2; 4096]).unwrap();
            }
            r => break r,
        }
        assert!(t.elapsed() < Duration::from_secs(5), "never ready");
    };
    assert_eq!(
        ready,
        Readiness::Ready {
            prepared: true,
            engine_us: 150_000
        }
    );
    assert!(
        t.elapsed() >= Duration::from_millis(150),
        "{:?}",
        t.elapsed()
    );
    assert!(waits >= 5, "{waits} polls while waiting");
    // Asked again: still ready, nothing more read or sent.
    assert_eq!(tx.readiness(Duration::ZERO).unwrap(), ready);
    drop(tx);
    drop(a);
    let kinds = dest.join().unwrap();
    assert_eq!(kinds[..2], [MANIFEST, VRAM], "{kinds:?}");
    assert_eq!(kinds.iter().filter(|&&k| k == WAIT).count(), 1, "{kinds:?}");
    assert!(
        kinds
            .iter()
            .all(|&k| k == MANIFEST || k == VRAM || k == WAIT)
    );
}
