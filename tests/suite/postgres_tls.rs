//! TLS to PostgreSQL (rustls): the test server is restarted listening on a TCP port of
//! localhost with a certificate signed by a test authority (`tests/common/certs.rs`); a store
//! given that authority connects over TLS (the server says so in `pg_stat_ssl`), one
//! without it is refused with a typed error, and `sslmode=disable` connects in the clear.
//!
//! It restarts the server it runs against, so it runs on a cluster of its own
//! ([`pg::Needs::OwnCluster`]), not on the one the other tests of the binary share.

#[cfg(feature = "postgres")]
use crate::common::pg;

#[cfg(feature = "postgres")]
mod cases {
    use std::os::unix::fs::{chown, PermissionsExt};
    use std::os::unix::process::CommandExt;
    use std::path::Path;
    use std::process::Command;

    use reliable_queue::{Error, Store};

    use super::pg::{block_on, connect, PgServer};

    fn setting(url: &str, query: &str) -> String {
        block_on(async {
            let client = connect(url).await;
            client.query_one(query, &[]).await.unwrap().get(0)
        })
    }

    /// Is the session of `tx`'s connection encrypted, as the server sees it?
    fn ssl_in_use(store: &Store) -> bool {
        let mut tx = store.begin();
        let rows = block_on(tx.query(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        ))
        .unwrap();
        tx.blocking_abort().unwrap();
        rows[0].get(0)
    }

    pub(crate) fn tls_connections_verify_the_server(server: &PgServer) {
        let (Some(data), true) = (server.data_dir(), server.started_here()) else {
            eprintln!("skipped: needs a server this test started (it restarts it)");
            return;
        };
        let certs = tempfile::tempdir().unwrap();
        let dir = certs.path();
        crate::common::certs::make(dir);
        for file in ["server.pem", "server.key"] {
            let to = data.join(file);
            std::fs::copy(dir.join(file), &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600)).unwrap();
            if let Some(uid) = server.run_as_uid() {
                chown(&to, Some(uid), None).unwrap();
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let bindir = setting(
            server.url(),
            "SELECT setting FROM pg_config WHERE name = 'BINDIR'",
        );
        let sockets = setting(server.url(), "SHOW unix_socket_directories");
        block_on(async {
            let admin = connect(server.url()).await;
            for statement in [
                "ALTER SYSTEM SET ssl = on".to_owned(),
                "ALTER SYSTEM SET ssl_cert_file = 'server.pem'".to_owned(),
                "ALTER SYSTEM SET ssl_key_file = 'server.key'".to_owned(),
                "ALTER SYSTEM SET listen_addresses = 'localhost'".to_owned(),
                format!("ALTER SYSTEM SET port = {port}"),
            ] {
                admin.batch_execute(&statement).await.unwrap();
            }
        });
        let mut restart = Command::new(Path::new(&bindir).join("pg_ctl"));
        restart
            .arg("-D")
            .arg(data)
            .arg("-l")
            .arg(data.parent().unwrap_or(data).join("server.log"))
            .args(["-w", "-t", "60", "-m", "fast", "restart"])
            .current_dir(data.parent().unwrap_or(data));
        if let Some(uid) = server.run_as_uid() {
            restart.uid(uid);
        }
        // With `-l` the server does not keep this pipe open (it would, inheriting it).
        let out = restart.output().unwrap();
        assert!(
            out.status.success(),
            "pg_ctl restart: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The Unix socket moved with the port; the harness stops the server by its data
        // directory, so the new port does not get in its way.
        let local = format!("host='{sockets}' port={port} user=rq dbname=postgres");
        assert_eq!(setting(&local, "SHOW ssl"), "on");

        let tcp = format!("host=localhost port={port} user=rq dbname=postgres");
        let ca = std::fs::read(dir.join("ca.pem")).unwrap();

        // With the authority: TLS, verified, and the queue works over it.
        let store = Store::builder()
            .postgres(&format!("{tcp} sslmode=require"))
            .postgres_tls_root_certificates(ca.clone())
            .postgres_schema("tls")
            .open()
            .expect("connect over TLS");
        assert!(ssl_in_use(&store));
        let q = store.blocking_queue::<String>("q").unwrap();
        let mut tx = store.begin();
        q.enqueue(&mut tx, "over tls".to_owned()).unwrap();
        tx.blocking_commit().unwrap();
        let mut tx = store.begin();
        assert_eq!(
            q.blocking_try_dequeue(&mut tx).unwrap().as_deref(),
            Some("over tls")
        );
        tx.blocking_commit().unwrap();
        drop(q);
        store.blocking_close().unwrap();

        // Without it the server's certificate is not trusted: a typed error.
        let refused = Store::builder()
            .postgres(&format!("{tcp} sslmode=require"))
            .postgres_schema("tls")
            .open();
        assert!(
            matches!(
                refused,
                Err(Error::Postgres { .. }) | Err(Error::InvalidConfig { .. })
            ),
            "{refused:?}"
        );
        // Not a certificate at all: refused before connecting.
        let garbage = Store::builder()
            .postgres(&format!("{tcp} sslmode=require"))
            .postgres_tls_root_certificates(b"not a certificate".to_vec())
            .postgres_schema("tls")
            .open();
        assert!(
            matches!(
                garbage,
                Err(Error::InvalidConfig {
                    setting: "postgres_tls_root_certificates",
                    ..
                })
            ),
            "{garbage:?}"
        );
        // `sslmode=disable`: in the clear.
        let plain = Store::builder()
            .postgres(&format!("{tcp} sslmode=disable"))
            .postgres_schema("tls")
            .open()
            .unwrap();
        assert!(!ssl_in_use(&plain));
    }
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
#[cfg(feature = "postgres")]
pub(crate) fn cases() -> Vec<crate::common::engines::Case> {
    if !crate::common::certs::available() {
        assert!(
            std::env::var_os(pg::REQUIRE_VAR).is_none(),
            "the TLS test needs the openssl command ({}=1)",
            pg::REQUIRE_VAR
        );
        eprintln!(
            "\n==> PostgreSQL TLS test SKIPPED: no `openssl` command to make its certificates \
             (Debian: apt-get install openssl)\n"
        );
        return Vec::new();
    }
    crate::common::engines::postgres_suite_with(vec![(
        "tls_connections_verify_the_server",
        pg::Needs::OwnCluster,
        cases::tls_connections_verify_the_server,
    )])
}
