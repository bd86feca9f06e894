//! The PostgreSQL test harness (`tests/pg`) itself: the server it gives the tests is real,
//! reachable, private (a Unix socket only), not running as root, and hands out independent
//! databases.

mod pg;

use std::os::unix::fs::MetadataExt;
use std::process::ExitCode;

use pg::{block_on, connect, PgServer};

fn main() -> ExitCode {
    pg::run_suite(vec![
        ("select_one", select_one),
        ("superuser_is_rq", superuser_is_rq),
        ("unix_socket_only", unix_socket_only),
        ("databases_are_independent", databases_are_independent),
        ("server_does_not_run_as_root", server_does_not_run_as_root),
    ])
}

fn select_one(server: &PgServer) {
    block_on(async {
        let client = connect(server.url()).await;
        let row = client.query_one("SELECT 1", &[]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 1);
    });
}

fn superuser_is_rq(server: &PgServer) {
    if !server.started_here() {
        // An existing server's user is whoever RQ_TEST_POSTGRES_URL names.
        return;
    }
    block_on(async {
        let client = connect(server.url()).await;
        let row = client
            .query_one(
                "SELECT current_user::text, usesuper FROM pg_user WHERE usename = current_user",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), pg::SUPERUSER);
        assert!(row.get::<_, bool>(1), "the harness's user is a superuser");
    });
}

fn unix_socket_only(server: &PgServer) {
    if !server.started_here() {
        return;
    }
    block_on(async {
        let client = connect(server.url()).await;
        let row = client
            .query_one("SHOW listen_addresses", &[])
            .await
            .unwrap();
        assert_eq!(row.get::<_, String>(0), "", "no TCP listener");
        let row = client
            .query_one("SELECT inet_server_addr() IS NULL", &[])
            .await
            .unwrap();
        assert!(
            row.get::<_, bool>(0),
            "this connection came over the Unix socket"
        );
    });
}

fn databases_are_independent(server: &PgServer) {
    let first = server.create_database("harness_first");
    let second = server.create_database("harness_second");
    assert_ne!(first, second);
    block_on(async {
        let a = connect(&first).await;
        let b = connect(&second).await;
        let name = |client: tokio_postgres::Client| async move {
            let row = client
                .query_one("SELECT current_database()::text", &[])
                .await
                .unwrap();
            row.get::<_, String>(0)
        };

        a.batch_execute("CREATE TABLE only_here (n int); INSERT INTO only_here VALUES (7)")
            .await
            .unwrap();
        let in_a = a
            .query_one("SELECT to_regclass('only_here') IS NOT NULL", &[])
            .await
            .unwrap();
        assert!(in_a.get::<_, bool>(0));
        let in_b = b
            .query_one("SELECT to_regclass('only_here') IS NOT NULL", &[])
            .await
            .unwrap();
        assert!(
            !in_b.get::<_, bool>(0),
            "a table in one database is not in the other"
        );
        // And the other way round: the second database takes a table of the same name.
        b.batch_execute("CREATE TABLE only_here (n int)")
            .await
            .unwrap();
        let count = b
            .query_one("SELECT count(*) FROM only_here", &[])
            .await
            .unwrap();
        assert_eq!(count.get::<_, i64>(0), 0);

        assert_eq!(name(a).await, "harness_first");
        assert_eq!(name(b).await, "harness_second");
    });
}

fn server_does_not_run_as_root(server: &PgServer) {
    if !server.started_here() {
        // An existing server may be on another machine: nothing to look at here.
        return;
    }
    let owner = |path: &str| std::fs::metadata(path).unwrap().uid();
    let (data_directory, backend_owner) = block_on(async {
        let client = connect(server.url()).await;
        let dir = client.query_one("SHOW data_directory", &[]).await.unwrap();
        let pid = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap();
        // Still connected: the backend process serving this connection is there to look at.
        let backend_owner = owner(&format!("/proc/{}", pid.get::<_, i32>(0)));
        (dir.get::<_, String>(0), backend_owner)
    });
    let data_dir = server.data_dir().unwrap();
    assert_eq!(
        std::path::Path::new(&data_directory),
        data_dir,
        "the server runs on the harness's data directory"
    );
    let pid_file = std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap();
    let postmaster_pid = pid_file.lines().next().unwrap().trim();
    let postmaster_owner = owner(&format!("/proc/{postmaster_pid}"));
    let data_owner = owner(&data_directory);
    let me = owner("/proc/self");

    assert_eq!(postmaster_owner, backend_owner);
    assert_eq!(
        data_owner, postmaster_owner,
        "the server owns its data directory"
    );
    if me == 0 {
        assert_ne!(postmaster_owner, 0, "the server does not run as root");
        assert_eq!(Some(postmaster_owner), server.run_as_uid());
    } else {
        assert_eq!(
            postmaster_owner, me,
            "the server runs as the tests' own user"
        );
        assert_eq!(server.run_as_uid(), None);
    }
}
