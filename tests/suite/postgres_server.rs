//! The PostgreSQL test harness (`tests/pg`) itself: the server it gives the tests is real,
//! reachable, private (a Unix socket only), not running as root, and hands out independent
//! databases.

use std::os::unix::fs::MetadataExt;

use crate::common::pg;
use pg::{block_on, connect, PgServer};

/// Set in a child of this binary: start a cluster, print its data directory, and leave by
/// `std::process::exit` without dropping it.
const EXIT_CHILD_VAR: &str = "RQ_TEST_PG_EXIT_CHILD";

/// In a child of this binary started by
/// [`a_test_process_that_exits_without_cleaning_up_leaves_no_server`] (not a test run): starts a
/// cluster, prints its data directory and exits without dropping it.
pub(crate) fn exit_child_if_asked() {
    if std::env::var_os(EXIT_CHILD_VAR).is_some() {
        let server = PgServer::start_cluster().expect("the binaries, as the parent found");
        println!("{}", server.data_dir().expect("started here").display());
        std::process::exit(0);
    }
}

/// The cases of this module of the suite (`tests/suite/main.rs`).
pub(crate) fn cases() -> Vec<crate::common::engines::Case> {
    crate::common::engines::postgres_suite_with(
        vec![(
            "a_test_process_that_exits_without_cleaning_up_leaves_no_server",
            pg::Needs::OwnCluster,
            a_test_process_that_exits_without_cleaning_up_leaves_no_server as pg::TestFn,
        )]
        .into_iter()
        .chain(shared_tests())
        .collect(),
    )
}

fn shared_tests() -> Vec<(&'static str, pg::Needs, pg::TestFn)> {
    let tests: Vec<(&'static str, pg::TestFn)> = vec![
        ("select_one", select_one),
        ("superuser_is_rq", superuser_is_rq),
        ("unix_socket_only", unix_socket_only),
        ("databases_are_independent", databases_are_independent),
        ("server_does_not_run_as_root", server_does_not_run_as_root),
    ];
    tests
        .into_iter()
        .map(|(name, test)| (name, pg::Needs::SharedServer, test))
        .collect()
}

/// A child of this binary starts a cluster and ends with `std::process::exit`, which runs no
/// destructor: the cluster's watchdog must stop the server and remove its directory all the
/// same. (The cluster handed to this test is not used: the child makes its own.)
fn a_test_process_that_exits_without_cleaning_up_leaves_no_server(_: &PgServer) {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .env(EXIT_CHILD_VAR, "1")
        .env_remove(pg::URL_VAR)
        .output()
        .expect("run the child");
    assert!(output.status.success(), "the child failed: {output:?}");
    let data_dir = std::path::PathBuf::from(String::from_utf8(output.stdout).unwrap().trim());
    assert!(
        data_dir.is_absolute(),
        "the child printed its data directory"
    );
    // Bounded: the watchdog waits up to a minute for the server to exit.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while data_dir.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the cluster of a process that exited is still at {}",
            data_dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Its postmaster is gone: the directory went only after it had exited (or had none).
    let needle = data_dir.to_string_lossy().into_owned();
    let running: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|entry| std::fs::read(entry.ok()?.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(&needle) && !cmdline.contains("rq-pg-watchdog"))
        .collect();
    assert!(
        running.is_empty(),
        "a server of the removed cluster still runs: {running:?}"
    );
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
