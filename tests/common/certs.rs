//! A certificate authority for the TLS tests and a server certificate it signed, made with
//! the `openssl` command (Debian: `apt-get install openssl`; CI installs it).

use std::path::Path;
use std::process::Command;

/// Whether the `openssl` command is there to make them.
pub fn available() -> bool {
    Command::new("openssl")
        .arg("version")
        .output()
        .is_ok_and(|out| out.status.success())
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (Debian: apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes into `dir` the authority (`ca.pem`, `ca.key`) and a certificate for `localhost`
/// and 127.0.0.1 that it signed (`server.pem`, `server.key`), valid for two days.
pub fn make(dir: &Path) {
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    for args in [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=reliable-queue test CA",
        ][..],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    ] {
        openssl(dir, args);
    }
}
