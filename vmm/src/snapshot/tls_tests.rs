//! Tests of `tls.rs` and the `tls:` transport: certificates made with rcgen at run time, a
//! destination on loopback that refuses every wrong peer during the handshake and keeps
//! listening, then carries bytes for the right one; the files' checks.

use super::*;
use crate::snapshot::transport::{Endpoint, EndpointError, Link};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A scratch directory, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("vgpu-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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

/// A certificate for `names` from `ca` (expired if `expired`), written as `tag`.crt/.key with
/// `trust`'s certificate as `tag`.ca: the files of one side.
fn side(d: &Dir, tag: &str, ca: &Ca, names: &[&str], expired: bool, trust: &Ca) -> TlsFiles {
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
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
    TlsFiles {
        cert: d.write(&format!("{tag}.crt"), &(cert.pem() + &ca.pem())),
        key: d.write(&format!("{tag}.key"), &key.serialize_pem()),
        ca: d.write(&format!("{tag}.ca"), &trust.pem()),
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn chat(mut c: Link) {
    c.write_all(b"hello").unwrap();
    let mut a = [0u8; 3];
    c.read_exact(&mut a).unwrap();
    assert_eq!(&a, b"ok\n");
}

#[test]
fn wrong_peers_are_refused_in_the_handshake_and_the_destination_keeps_listening() {
    let d = Dir::new("refuse");
    let (good, other) = (ca("good CA"), ca("other CA"));
    let server = side(&d, "server", &good, &["localhost"], false, &good);
    let client = side(&d, "client", &good, &["source"], false, &good);
    let port = free_port();
    let at = |host: &str| Endpoint::parse(&format!("tls:{host}:{port}")).unwrap();
    let incoming = at("localhost").bind(Some(&server)).unwrap();
    let dest = std::thread::spawn(move || {
        let mut c = incoming.accept_within(Duration::from_millis(500)).unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).unwrap();
        c.write_all(b"ok\n").unwrap();
        b
    });
    let refused = |to: &Endpoint, files: &TlsFiles| match to.connect(Some(files)) {
        Err(EndpointError::Tls { err, .. }) => err.to_string(),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("{to} accepted {files:?}"),
    };
    // A source whose certificate another CA issued: the destination refuses it.
    let stranger = side(&d, "stranger", &other, &["source"], false, &good);
    let e = refused(&at("localhost"), &stranger);
    assert!(e.contains("refused this side's certificate"), "{e}");
    // An expired certificate from the right CA.
    let expired = side(&d, "expired", &good, &["source"], true, &good);
    let e = refused(&at("localhost"), &expired);
    assert!(e.contains("refused this side's certificate"), "{e}");
    // The destination is not who HOST names (its certificate names localhost only).
    let e = refused(&at("127.0.0.1"), &client);
    assert!(e.contains("not valid for name"), "{e}");
    // A source that trusts another CA than the destination's.
    let wary = side(&d, "wary", &good, &["source"], false, &other);
    let e = refused(&at("localhost"), &wary);
    assert!(e.contains("UnknownIssuer"), "{e}");
    // A TLS client without a certificate: the handshake's end is an alert, not the acceptance.
    let roots = client.load().unwrap().roots;
    let anon = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut anon = anon;
    anon.alpn_protocols = vec![ALPN.to_vec()];
    let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let name = server_name("localhost").unwrap();
    let e = TlsStream::connect(Arc::new(anon), name, sock, "dest").unwrap_err();
    assert!(matches!(e, TlsError::Refused { .. }), "{e}");
    // Not TLS at all (a plain tcp: source), and one that connects and says nothing (the
    // destination gives up on it after its handshake limit).
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain
        .write_all(&[1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0])
        .unwrap();
    let mut rest = Vec::new();
    let _ = plain.read_to_end(&mut rest);
    assert!(!rest.windows(ACCEPTED.len()).any(|w| w == ACCEPTED));
    let silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // The right source after all of them.
    chat(at("localhost").connect(Some(&client)).unwrap());
    assert_eq!(&dest.join().unwrap(), b"hello");
    drop(silent);
}

#[test]
fn an_ip_address_in_the_certificate_names_the_destination() {
    let d = Dir::new("ip");
    let good = ca("good CA");
    let server = side(&d, "server", &good, &["127.0.0.1"], false, &good);
    let client = side(&d, "client", &good, &["source"], false, &good);
    let to = Endpoint::parse(&format!("tls:127.0.0.1:{}", free_port())).unwrap();
    let incoming = to.bind(Some(&server)).unwrap();
    let dest = std::thread::spawn(move || {
        let mut c = incoming.accept_one().unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).unwrap();
        c.write_all(b"ok\n").unwrap();
        b
    });
    chat(to.connect(Some(&client)).unwrap());
    assert_eq!(&dest.join().unwrap(), b"hello");
}

#[test]
fn files_are_checked() {
    let d = Dir::new("files");
    let good = ca("good CA");
    let f = side(&d, "a", &good, &["localhost", "10.0.0.1"], false, &good);
    f.check().unwrap();
    let g = side(&d, "b", &good, &["localhost"], false, &good);
    let e = |f: &TlsFiles| f.check().unwrap_err().to_string();
    // Missing, not PEM, no key, a key of another certificate, an empty CA file, too large.
    let missing = TlsFiles {
        ca: d.0.join("nothing"),
        ..f.clone()
    };
    assert!(e(&missing).contains("nothing"), "{}", e(&missing));
    let junk = d.write("junk", "-----BEGIN CERTIFICATE-----\n!!!\n");
    let not_pem = TlsFiles {
        cert: junk.clone(),
        ..f.clone()
    };
    assert!(e(&not_pem).contains("junk"), "{}", e(&not_pem));
    let no_key = TlsFiles {
        key: f.cert.clone(),
        ..f.clone()
    };
    assert!(e(&no_key).contains("no PRIVATE KEY"), "{}", e(&no_key));
    let other_key = TlsFiles {
        key: g.key.clone(),
        ..f.clone()
    };
    assert!(
        e(&other_key).contains("certificate and key"),
        "{}",
        e(&other_key)
    );
    let empty = TlsFiles {
        ca: d.write("empty", ""),
        ..f.clone()
    };
    assert!(e(&empty).contains("no CERTIFICATE"), "{}", e(&empty));
    let big = TlsFiles {
        ca: d.write("big", &"x".repeat(MAX_FILE as usize + 1)),
        ..f.clone()
    };
    assert!(e(&big).contains("more than"), "{}", e(&big));
    // Relative paths are refused where the VM reads them.
    let rel = TlsFiles {
        key: "a.key".into(),
        ..f.clone()
    };
    assert!(rel.check_absolute().is_err());
    f.check_absolute().unwrap();
    // Names: DNS names and IP addresses (IPv6 bracketed in the URL); tls: anywhere.
    for ok in [
        "tls:localhost:1",
        "tls:10.1.2.3:4444",
        "tls:[::1]:4444",
        "tls:h.example:9",
    ] {
        assert!(Endpoint::parse(ok).is_ok(), "{ok}");
    }
    for bad in ["tls:", "tls:h", "tls::80", "tls:a b:80"] {
        assert!(Endpoint::parse(bad).is_err(), "{bad}");
    }
    // A tls: endpoint needs files; the others refuse them.
    let e = Endpoint::parse("tls:localhost:1").unwrap();
    assert!(matches!(e.connect(None), Err(EndpointError::NoTlsFiles(_))));
    let e = Endpoint::parse("tcp:localhost:1").unwrap();
    assert!(matches!(
        e.connect(Some(&f)),
        Err(EndpointError::TlsFilesUnused(_))
    ));
}

/// The source's polled reads of the destination's lines ([`Link::try_read`]) over TLS: nothing
/// within the wait while the destination is silent, then its lines, cut and whole, with the
/// final answer's start kept (`ready::Inbox`).
#[test]
fn polled_reads_of_the_destinations_lines_over_tls() {
    use super::super::ready::{DestMsg, Inbox};
    let d = Dir::new("poll");
    let good = ca("good CA");
    let server = side(&d, "server", &good, &["localhost"], false, &good);
    let client = side(&d, "client", &good, &["source"], false, &good);
    let to = Endpoint::parse(&format!("tls:localhost:{}", free_port())).unwrap();
    let incoming = to.bind(Some(&server)).unwrap();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let dest = std::thread::spawn(move || {
        let mut c = incoming.accept_one().unwrap();
        go_rx.recv().unwrap();
        c.write_all(b"ready/1 hel").unwrap();
        c.flush().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        c.write_all(b"lo\nready/1 fallback\nok").unwrap();
        c.flush().unwrap();
        go_rx.recv().unwrap();
    });
    let c = to.connect(Some(&client)).unwrap();
    let mut inbox = Inbox::default();
    let t = std::time::Instant::now();
    assert_eq!(inbox.poll(&c, Duration::from_millis(50)), Ok(None));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    go_tx.send(()).unwrap();
    let mut got = Vec::new();
    let t = std::time::Instant::now();
    while got.len() < 2 && t.elapsed() < Duration::from_secs(5) {
        if let Some(m) = inbox.poll(&c, Duration::from_millis(20)).unwrap() {
            got.push(m);
        }
    }
    assert_eq!(
        got,
        vec![
            DestMsg::Hello,
            DestMsg::Ready {
                prepared: false,
                engine_us: 0
            }
        ]
    );
    let t = std::time::Instant::now();
    while inbox.rest().is_empty() && t.elapsed() < Duration::from_secs(5) {
        assert_eq!(inbox.poll(&c, Duration::from_millis(20)), Ok(None));
    }
    assert_eq!(inbox.rest(), b"ok");
    go_tx.send(()).unwrap();
    dest.join().unwrap();
}
