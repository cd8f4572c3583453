//! Migration over `tls:HOST:PORT` (mutual TLS, docs/snapshot.md "Migration"), certificates made
//! with rcgen at run time: one destination (`--incoming tls:localhost:PORT`) refuses in the
//! handshake a source whose certificate another CA issued, an expired one, a source that does
//! not trust its CA, a source that finds its name wrong, a client with no certificate and a
//! plain-TCP stream, and keeps listening; the source VM runs on after each refusal, then
//! migrates (live) to it and the guest finishes there exactly as an uninterrupted run.

mod snapshot_support;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use snapshot_support::*;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The `count` guest, long enough for the refusals before its migration (120 steps of 20 ms).
const ARGS: [&str; 8] = [
    "--guest",
    "count",
    "--cmdline",
    "steps=120 ms=20",
    "--cpus",
    "2",
    "--memory",
    "64",
];

type Ca = CertifiedIssuer<'static, KeyPair>;

fn ca(name: &str) -> Ca {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

/// One side's files: a certificate for `names` from `ca` (expired if `expired`), its key, and
/// `trust`'s certificate as the CA to check the peer against.
struct Side {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl Side {
    fn new(s: &Scratch, tag: &str, ca: &Ca, names: &[&str], expired: bool, trust: &Ca) -> Self {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut p = CertificateParams::new(names).unwrap();
        p.distinguished_name.push(DnType::CommonName, tag);
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let cert = p.signed_by(&key, ca).unwrap();
        let write = |ext: &str, text: String| {
            let p = s.path(&format!("{tag}.{ext}"));
            std::fs::write(&p, text).unwrap();
            p
        };
        Side {
            cert: write("crt", cert.pem() + &ca.pem()),
            key: write("key", key.serialize_pem()),
            ca: write("ca", trust.pem()),
        }
    }

    /// `--tls-cert F --tls-key F --tls-ca F`.
    fn args(&self) -> Vec<String> {
        [
            ("--tls-cert", &self.cert),
            ("--tls-key", &self.key),
            ("--tls-ca", &self.ca),
        ]
        .iter()
        .flat_map(|(k, v)| [k.to_string(), v.display().to_string()])
        .collect()
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `ctl migrate URL` with `extra` options: (exit code, stdout, stderr).
fn migrate_to(vm: &Vm, url: &str, extra: &[String]) -> (i32, String, String) {
    let mut args = vec!["migrate", url];
    args.extend(extra.iter().map(String::as_str));
    vm.ctl(&args)
}

/// A TLS client with the right CA and ALPN but no certificate: what it reads after its side
/// of the handshake (an error: the destination's alert).
fn anonymous_client(port: u16, ca: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![vmm::snapshot::tls::ALPN.to_vec()];
    let name = "localhost".try_into().unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let mut got = vec![0u8; 8];
    tls.read_exact(&mut got).map(|()| got)
}

#[test]
fn tls_migration_refuses_wrong_peers_and_then_moves_the_vm() {
    let reference = std::thread::spawn(|| run(&ARGS));
    let s = Scratch::new("migrate-tls");
    let (good, other) = (ca("good CA"), ca("other CA"));
    let server = Side::new(&s, "server", &good, &["localhost"], false, &good);
    let client = Side::new(&s, "client", &good, &["source"], false, &good);
    let stranger = Side::new(&s, "stranger", &other, &["source"], false, &good);
    let expired = Side::new(&s, "expired", &good, &["source"], true, &good);
    let wary = Side::new(&s, "wary", &good, &["source"], false, &other);
    let port = free_port();
    let url = format!("tls:localhost:{port}");
    let dest = Command::new(BIN)
        .args(["--incoming", &url, "--timeout", "120"])
        .args(server.args())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut args: Vec<String> = ARGS.iter().map(|a| a.to_string()).collect();
    args.extend(client.args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let vm = Vm::start(&s, "src", &args);
    vm.wait_for(|o| o.contains("COUNT step=8 "));
    let running = |vm: &Vm| assert_eq!(json(&vm.ctl(&["stats"]).1)["state"], "running");

    // A certificate another CA issued (given to this request instead of the VM's own): the
    // destination refuses it. Until the destination listens, the connection itself fails.
    let start = Instant::now();
    let err = loop {
        let (code, _, err) = migrate_to(&vm, &url, &stranger.args());
        assert_eq!(code, 1, "{err}");
        if !err.contains("Connection refused") {
            break err;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{err}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(err.contains("refused this side's certificate"), "{err}");
    assert!(err.contains("UnknownCA"), "{err}");
    running(&vm);
    // Expired, from the right CA.
    let (code, _, err) = migrate_to(&vm, &url, &expired.args());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("CertificateExpired"), "{err}");
    // The VM's own files, but the destination is not who the address names (its certificate
    // names localhost, not 127.0.0.1).
    let (code, _, err) = migrate_to(&vm, &format!("tls:127.0.0.1:{port}"), &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not valid for name \"127.0.0.1\""), "{err}");
    // A source that trusts another CA than the destination's.
    let (code, _, err) = migrate_to(&vm, &url, &wary.args());
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("UnknownIssuer"), "{err}");
    running(&vm);
    // No client certificate; then a plain-TCP source's stream (a manifest frame): neither is
    // answered with anything but the handshake's alert.
    let e = anonymous_client(port, &client.ca).unwrap_err();
    assert!(e.to_string().contains("CertificateRequired"), "{e}");
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.write_all(&1u32.to_le_bytes()).unwrap();
    plain.write_all(&100u64.to_le_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"error: ") && !answer.starts_with(b"ok"),
        "{answer:?}"
    );

    // The right source, live, with the files it was started with.
    let (code, out, err) = migrate_to(&vm, &url, &["--live".to_string()]);
    assert_eq!(code, 0, "{err}");
    let done = json(&out);
    assert_eq!(done["to"], url.as_str());
    assert!(!done["rounds"].as_array().unwrap().is_empty(), "{out}");
    let (code, before, err) = vm.finish();
    assert_eq!(code, 0, "{err}");
    let out = dest.wait_with_output().unwrap();
    let dest_err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{dest_err}");
    let after = String::from_utf8(out.stdout).unwrap();
    let (code, want, err) = reference.join().unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(want.contains("COUNT done steps=120 "), "{want}");
    assert_eq!(format!("{before}{after}"), want);
    // The destination logged each refused connection and went on listening.
    let refusals = dest_err.matches("still listening").count();
    assert_eq!(refusals, 6, "{dest_err}");
}

/// A standby listening on `tls:` (`ctl incoming tls:... --wait-s 2`) refuses a peer that is
/// not TLS and waits on to its deadline, not past it (a failed handshake once left it in a
/// blocking accept until some source came): then it takes requests again.
#[test]
fn a_standby_on_tls_refuses_a_bad_peer_and_stops_listening_at_its_deadline() {
    let s = Scratch::new("migrate-tls-standby");
    let ca = ca("ca");
    let dst = Side::new(&s, "dst", &ca, &["localhost"], false, &ca);
    let tls = dst.args();
    let mut args = vec!["--memory", "64"];
    args.extend(tls.iter().map(String::as_str));
    let sb = snapshot_support::standby::Standby::start(&s, "sb", &args);
    let port = free_port();
    let t = Instant::now();
    let url = format!("tls:localhost:{port}");
    let (code, out, err) = sb.ctl(&["incoming", &url, "--wait-s", "2"]);
    assert_eq!(code, 0, "{out} {err}");
    // Not TLS at all: refused at its first bytes, the connection closed.
    let mut c = std::net::TcpStream::connect(("localhost", port)).unwrap();
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut sink = Vec::new();
    let _ = c.read_to_end(&mut sink);
    let (code, out, err) = sb.ctl(&["stats"]);
    let took = t.elapsed();
    assert_eq!(code, 0, "{err}");
    assert_eq!(json(&out)["state"], "standby", "{out}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(20),
        "{took:?}"
    );
}
