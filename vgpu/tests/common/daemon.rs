//! A scripted `vgpud` for the daemon link's tests: the daemon's side of a registration.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use vgpu_proto::proto::{self, ToDaemon, ToVm};
use vgpu_proto::wire::{Conn, Listener, Received};

/// Accepts the VM on `listener`, reads its `hello` and welcomes it (VM 1 on GPU 0) with a new
/// file at `vram_path` of the size it asked for as its VRAM.
pub fn accept_and_welcome(listener: &Listener, vram_path: &Path) -> Conn {
    let conn = loop {
        if let Some(c) = listener.accept().unwrap() {
            break c;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut buf = [0u8; proto::MAX_MESSAGE];
    let h = loop {
        conn.wait_readable().unwrap();
        match conn.recv(&mut buf).unwrap() {
            Received::Message(n, _) => match proto::decode(&buf[..n]).unwrap() {
                ToDaemon::Hello(h) => break h,
                m => panic!("expected hello, got {m:?}"),
            },
            Received::Empty => {}
            Received::Closed => panic!("the VM closed the link"),
        }
    };
    let vram = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(vram_path)
        .unwrap();
    vram.set_len(h.vram).unwrap();
    let welcome = ToVm::Welcome {
        version: proto::VERSION,
        vm: 1,
        vram_offset: 0,
        vram_size: h.vram,
        boot: None,
        gpu: Some(proto::Placement {
            index: 0,
            device: 0,
        }),
    };
    conn.send(&proto::encode(&welcome), Some(vram.as_fd()))
        .unwrap();
    conn
}

/// The next message from the VM on `c`, within 5 s.
pub fn next(c: &Conn) -> ToDaemon {
    let mut buf = [0u8; proto::MAX_MESSAGE];
    let t = Instant::now();
    loop {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no message from the VM"
        );
        if !c
            .wait_readable_for(Some(Duration::from_millis(50)))
            .unwrap()
        {
            continue;
        }
        match c.recv(&mut buf).unwrap() {
            Received::Message(n, _) => return proto::decode(&buf[..n]).unwrap(),
            Received::Empty => {}
            Received::Closed => panic!("the VM closed the link"),
        }
    }
}
