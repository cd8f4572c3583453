//! What TLS costs a migration link, without a VM (docs/performance.md, "Migration over TLS"):
//! `MIGRATION_LINK_MIB` MiB (default 1024) written in 1 MiB pieces through a `tcp:` and a
//! `tls:` link on loopback (certificates made with rcgen), three runs each, alternating.
//! Prints per run the wall-clock throughput and the CPU time the sending and the receiving
//! thread spent per GB (thread CPU clocks: less disturbed by other load than wall time).
//! Run: `cargo bench -p vmm --bench migration_link`.

use std::io::{Read, Write};
use std::time::Instant;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
};
use vmm::snapshot::tls::TlsFiles;
use vmm::snapshot::transport::Endpoint;

/// CPU time of the calling thread, in seconds.
fn thread_cpu() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; the clock id is valid on Linux.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(r, 0);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Both sides' files in `dir`: a CA, a server certificate for localhost, a client one.
fn files(dir: &std::path::Path) -> (TlsFiles, TlsFiles) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let ca_file = write("ca.crt", ca.pem());
    let side = |tag: &str| {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &ca).unwrap();
        TlsFiles {
            cert: write(&format!("{tag}.crt"), cert.pem()),
            key: write(&format!("{tag}.key"), key.serialize_pem()),
            ca: ca_file.clone(),
        }
    };
    (side("server"), side("client"))
}

/// One run: (wall seconds, sender CPU seconds, receiver CPU seconds).
fn run(url: &str, server: Option<TlsFiles>, client: Option<&TlsFiles>, mib: usize) -> [f64; 3] {
    let to = Endpoint::parse(url).unwrap();
    let incoming = to.bind(server.as_ref()).unwrap();
    let receiver = std::thread::spawn(move || {
        let mut link = incoming.accept_one().unwrap();
        let cpu = thread_cpu();
        let mut buf = vec![0u8; 1 << 20];
        let mut sum = 0u64;
        for _ in 0..mib {
            link.read_exact(&mut buf).unwrap();
            sum = sum.wrapping_add(u64::from(buf[4095]));
        }
        link.write_all(b"k").unwrap();
        (thread_cpu() - cpu, sum)
    });
    let mut link = to.connect(client).unwrap();
    let piece: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let (start, cpu) = (Instant::now(), thread_cpu());
    for _ in 0..mib {
        link.write_all(&piece).unwrap();
    }
    link.flush().unwrap();
    let mut ack = [0u8; 1];
    link.read_exact(&mut ack).unwrap();
    let (wall, sent_cpu) = (start.elapsed().as_secs_f64(), thread_cpu() - cpu);
    let (received_cpu, sum) = receiver.join().unwrap();
    assert_eq!(sum, u64::from(piece[4095]) * mib as u64);
    [wall, sent_cpu, received_cpu]
}

fn main() {
    let mib: usize = std::env::var("MIGRATION_LINK_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let dir = std::env::temp_dir().join(format!("vgpu-link-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (server, client) = files(&dir);
    let gb = mib as f64 * (1u64 << 20) as f64 / 1e9;
    for rep in 0..3 {
        for tls in [false, true] {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let (url, s, c) = match tls {
                false => (format!("tcp:127.0.0.1:{port}"), None, None),
                true => (
                    format!("tls:localhost:{port}"),
                    Some(server.clone()),
                    Some(&client),
                ),
            };
            let [wall, tx, rx] = run(&url, s, c, mib);
            println!(
                "run {rep} {:3}: {mib} MiB in {:.0} ms, {:.0} MB/s; CPU per GB: sender {:.2} s, \
                 receiver {:.2} s",
                if tls { "tls" } else { "tcp" },
                wall * 1e3,
                gb * 1e3 / wall,
                tx / gb,
                rx / gb
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
