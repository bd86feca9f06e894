//! The dashboard in a real browser: headless Chromium driven over WebDriver (Debian's
//! `chromium` and `chromium-driver`; `CHROMEDRIVER` names another driver), against a dashboard
//! mounted under a prefix of a service's router, on stores with a known workload: a sled store
//! and a PostgreSQL one (the root crate's harness, `tests/pg/mod.rs`).
//!
//! Each engine's cases: the counts the page shows equal `stats()`; a commit updates the live
//! counters without a reload; replaying a dead letter through the page (sign in, select,
//! confirm) moves it back to the queue; a payload of `<script>` and `<img onerror>` stays
//! text; an action without the token is refused (from the page, and through the API).
//! Screenshots go to `target/browser-screenshots/`.
//!
//! Without Chromium or its driver every case is reported ignored under a banner;
//! `RQ_TEST_REQUIRE_BROWSER=1` (CI) makes that a failure. Without PostgreSQL the PostgreSQL
//! cases are ignored the same way (`RQ_TEST_REQUIRE_POSTGRES=1` makes it a failure).

#[path = "../../tests/pg/mod.rs"]
mod pg;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use libtest_mimic::{Arguments, Failed, Trial};
use reliable_queue::{Lease, RetryPolicy, Store};
use reliable_queue_web::Dashboard;

/// The admin token of every dashboard here.
const TOKEN: &str = "browser-test-token";

/// How long a page may take to show what a case waits for.
const PATIENCE: Duration = Duration::from_secs(20);

/// The payload that must stay text.
const XSS: &str = "<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 1\">";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime")
    })
}

/// chromedriver and a browser session on it.
struct Browser {
    driver: Child,
    client: Client,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let client = self.client.clone();
        let _ = runtime().block_on(client.close());
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn find(names: &[&str]) -> Option<PathBuf> {
    names.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Starts chromedriver and a headless Chromium session, or says why it cannot.
fn start_browser() -> Result<Browser, String> {
    let driver_path = std::env::var_os("CHROMEDRIVER")
        .map(PathBuf::from)
        .or_else(|| find(&["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]))
        .ok_or("no chromedriver: install Debian's chromium-driver (apt-get install chromium chromium-driver)")?;
    let chromium = find(&[
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
        "/usr/bin/google-chrome",
    ])
    .ok_or("no Chromium: install Debian's chromium (apt-get install chromium chromium-driver)")?;
    let mut driver = Command::new(&driver_path)
        .arg("--port=0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", driver_path.display()))?;
    // chromedriver says on which port it listens once it does ("... started successfully on
    // port N."); the rest of what it prints is drained, so it never blocks on a full pipe.
    let mut lines = BufReader::new(driver.stdout.take().ok_or("no stdout")?).lines();
    let port: u16 = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains("started successfully"))
        .and_then(|l| {
            l.trim_end_matches('.')
                .rsplit(' ')
                .next()
                .and_then(|p| p.parse().ok())
        })
        .ok_or_else(|| {
            let _ = driver.kill();
            "chromedriver exited before it listened".to_owned()
        })?;
    std::thread::spawn(move || lines.for_each(drop));
    let profile = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "binary": chromium,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--window-size=1280,900",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = runtime()
        .block_on(
            ClientBuilder::new(connector)
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .map_err(|e| {
            let _ = driver.kill();
            format!("cannot start a Chromium session: {e}")
        })?;
    Ok(Browser {
        driver,
        client,
        _profile: profile,
    })
}

/// A store with a known workload, its dashboard served under `/ops/queues` of a service's
/// router, and a read-only dashboard beside it.
struct Site {
    engine: &'static str,
    store: Store,
    /// The dashboard's URL (with the admin token configured).
    base: String,
    /// A dashboard of the same store with no admin token.
    read_only: String,
    /// The workload's leased item, held to the end.
    _lease: Lease<String>,
    _dir: Option<tempfile::TempDir>,
}

async fn serve(router: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let app = axum::Router::new().nest("/ops/queues", router);
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/ops/queues")
}

/// The workload: `jobs` with 11 ready items, 3 delayed, 1 leased (the lease returned) and 2
/// dead letters; `xss` with the hostile payload.
fn fill(store: &Store) -> Lease<String> {
    let jobs = store.blocking_queue::<String>("jobs").unwrap();
    jobs.blocking_set_retry_policy(RetryPolicy::default().max_attempts(1))
        .unwrap();
    let mut tx = store.begin();
    for i in 0..14 {
        jobs.enqueue(&mut tx, format!("job {i}")).unwrap();
    }
    for i in 0..3 {
        jobs.enqueue_after(&mut tx, format!("later {i}"), Duration::from_secs(3600))
            .unwrap();
    }
    tx.blocking_commit().unwrap();
    for reason in ["bad input", "upstream down"] {
        let lease = jobs.blocking_lease(Duration::from_secs(600)).unwrap();
        lease.blocking_fail(reason).unwrap();
    }
    let held = jobs.blocking_lease(Duration::from_secs(3600)).unwrap();
    let xss = store.blocking_queue::<String>("xss").unwrap();
    let mut tx = store.begin();
    xss.enqueue(&mut tx, XSS.to_owned()).unwrap();
    tx.blocking_commit().unwrap();
    held
}

fn site(engine: &'static str, store: Store, dir: Option<tempfile::TempDir>) -> Site {
    let lease = fill(&store);
    let (base, read_only) = runtime().block_on(async {
        let router = Dashboard::new(store.clone())
            .admin_token(Some(TOKEN.to_owned()))
            .router()
            .expect("a router");
        let read_only = Dashboard::new(store.clone()).router().expect("a router");
        (serve(router).await, serve(read_only).await)
    });
    Site {
        engine,
        store,
        base,
        read_only,
        _lease: lease,
        _dir: dir,
    }
}

type Case = fn(&Client, &Site) -> Result<(), Failed>;

fn check(ok: bool, what: impl Into<String>) -> Result<(), Failed> {
    if ok {
        Ok(())
    } else {
        Err(Failed::from(what.into()))
    }
}

async fn cell(client: &Client, queue: &str, field: &str) -> Result<String, Failed> {
    let xpath = format!("//tr[@data-queue='{queue}']/td[@data-field='{field}']");
    let element = client
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::XPath(&xpath))
        .await
        .map_err(|e| Failed::from(format!("no {field} cell for {queue}: {e}")))?;
    element
        .text()
        .await
        .map_err(|e| Failed::from(e.to_string()))
}

/// Waits until the page shows `want` in `queue`'s `field` cell (updated by the event stream).
async fn shows(client: &Client, queue: &str, field: &str, want: u64) -> Result<(), Failed> {
    let xpath = format!(
        "//tr[@data-queue='{queue}']/td[@data-field='{field}'][normalize-space(.)='{want}']"
    );
    client
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::XPath(&xpath))
        .await
        .map(|_| ())
        .map_err(|e| Failed::from(format!("{queue}.{field} never showed {want}: {e}")))
}

fn screenshot(client: &Client, name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/browser-screenshots");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(png) = runtime().block_on(client.screenshot()) {
        let _ = std::fs::write(dir.join(format!("{name}.png")), png);
    }
}

fn counts_equal_stats(client: &Client, site: &Site) -> Result<(), Failed> {
    runtime().block_on(async {
        client
            .goto(&site.base)
            .await
            .map_err(|e| Failed::from(e.to_string()))?;
        let q = site.store.queue::<String>("jobs").await.unwrap();
        let stats = q.stats().await.unwrap();
        for (field, want) in [
            ("ready", stats.visible),
            ("delayed", stats.delayed),
            ("leased", stats.leased),
            ("held", stats.held),
            ("dead", stats.dead),
        ] {
            let shown = cell(client, "jobs", field).await?;
            check(
                shown == want.to_string(),
                format!("jobs.{field}: the page shows {shown}, stats() says {want}"),
            )?;
        }
        check(
            (stats.visible, stats.delayed, stats.leased, stats.dead) == (11, 3, 1, 2),
            format!("the workload's stats: {stats:?}"),
        )
    })?;
    screenshot(client, &format!("{}-overview", site.engine));
    Ok(())
}

fn commits_update_the_page_live(client: &Client, site: &Site) -> Result<(), Failed> {
    runtime().block_on(async {
        client
            .goto(&site.base)
            .await
            .map_err(|e| Failed::from(e.to_string()))?;
        let q = site.store.queue::<String>("live").await.unwrap();
        // A queue made after the page loaded shows up, then its count follows commits.
        let mut tx = site.store.begin();
        for i in 0..5 {
            q.enqueue(&mut tx, format!("live {i}")).unwrap();
        }
        tx.commit().await.unwrap();
        shows(client, "live", "ready", 5).await?;
        let mut tx = site.store.begin();
        for i in 0..7 {
            q.enqueue(&mut tx, format!("more {i}")).unwrap();
        }
        tx.commit().await.unwrap();
        shows(client, "live", "ready", 12).await?;
        // Still the same page: no reload happened.
        let url = client
            .current_url()
            .await
            .map_err(|e| Failed::from(e.to_string()))?;
        check(
            url.as_str() == site.base.clone(),
            format!("the page moved to {url}"),
        )
    })
}

async fn sign_in(client: &Client, site: &Site) -> Result<(), Failed> {
    let err = |e: fantoccini::error::CmdError| Failed::from(e.to_string());
    client
        .goto(&format!("{}/login", site.base))
        .await
        .map_err(err)?;
    let field = client
        .find(Locator::Css("input[name=token]"))
        .await
        .map_err(err)?;
    field.send_keys(TOKEN).await.map_err(err)?;
    client
        .find(Locator::Css("form button[type=submit]"))
        .await
        .map_err(err)?
        .click()
        .await
        .map_err(err)?;
    client
        .wait()
        .at_most(PATIENCE)
        .for_element(Locator::XPath(
            "//form[@action and .//button[normalize-space(.)='Sign out']]",
        ))
        .await
        .map(|_| ())
        .map_err(|e| Failed::from(format!("signing in did not work: {e}")))
}

fn replaying_a_dead_letter_moves_it(client: &Client, site: &Site) -> Result<(), Failed> {
    let err = |e: fantoccini::error::CmdError| Failed::from(e.to_string());
    runtime().block_on(async {
        let q = site.store.queue::<String>("jobs").await.unwrap();
        let before = q.stats().await.unwrap();
        let dead = q.dead_letters(None, 10).await.unwrap();
        let first = dead
            .first()
            .ok_or_else(|| Failed::from("no dead letter to replay"))?;
        sign_in(client, site).await?;
        client
            .goto(&format!("{}/queues/jobs/dead", site.base))
            .await
            .map_err(err)?;
        client
            .find(Locator::Css(&format!(
                "tr[data-id='{}'] input[type=checkbox]",
                first.id
            )))
            .await
            .map_err(err)?
            .click()
            .await
            .map_err(err)?;
        client
            .find(Locator::Css("button[value=replay]"))
            .await
            .map_err(err)?
            .click()
            .await
            .map_err(err)?;
        // The confirmation page says what will happen; nothing moved yet.
        let confirm = client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Id("confirm"))
            .await
            .map_err(err)?;
        check(
            q.stats().await.unwrap().dead == before.dead,
            "a GET moved a dead letter",
        )?;
        confirm.click().await.map_err(err)?;
        let done = client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Id("done"))
            .await
            .map_err(err)?;
        let said = done.text().await.map_err(err)?;
        check(said == "Replayed 1.", format!("the page said {said:?}"))?;
        let after = q.stats().await.unwrap();
        check(
            (after.dead, after.visible) == (before.dead - 1, before.visible + 1),
            format!("before {before:?}, after {after:?}"),
        )?;
        let back = q.browse(None, 100).await.unwrap();
        check(
            back.iter().any(|i| i.item == first.item),
            "the replayed item is not in the queue",
        )
    })?;
    screenshot(client, &format!("{}-dead-letters", site.engine));
    Ok(())
}

fn a_hostile_payload_stays_text(client: &Client, site: &Site) -> Result<(), Failed> {
    let err = |e: fantoccini::error::CmdError| Failed::from(e.to_string());
    runtime().block_on(async {
        client.goto(&format!("{}/queues/xss", site.base)).await.map_err(err)?;
        let payload = client
            .wait()
            .at_most(PATIENCE)
            .for_element(Locator::Css("td.payload code"))
            .await
            .map_err(err)?;
        let shown = payload.text().await.map_err(err)?;
        check(shown.contains("<script>window.__xss = 1</script>"), format!("the payload shows as {shown:?}"))?;
        let id = client
            .find(Locator::Css("table.items tbody td.n a"))
            .await
            .map_err(err)?
            .text()
            .await
            .map_err(err)?;
        client.goto(&format!("{}/queues/xss/items/{id}", site.base)).await.map_err(err)?;
        let pre = client.find(Locator::Css("pre.payload")).await.map_err(err)?;
        let text = pre.text().await.map_err(err)?;
        check(text.contains("onerror"), format!("the item page shows {text:?}"))?;
        let ran = client
            .execute("return window.__xss === undefined && document.querySelectorAll('main script, main img').length === 0", vec![])
            .await
            .map_err(err)?;
        check(ran == serde_json::Value::Bool(true), "the payload ran or made elements")
    })
}

fn an_action_without_the_token_is_refused(client: &Client, site: &Site) -> Result<(), Failed> {
    let err = |e: fantoccini::error::CmdError| Failed::from(e.to_string());
    runtime().block_on(async {
        let q = site.store.queue::<String>("jobs").await.unwrap();
        let before = q.stats().await.unwrap().dead;
        let id = q.dead_letters(None, 1).await.unwrap()[0].id;
        // A browser that never signed in posts the form, and the API is called with a wrong
        // token and with none; on the read-only dashboard, with the right one.
        let _ = client.delete_all_cookies().await;
        client.goto(&site.base).await.map_err(err)?;
        let script = "const [url, body] = arguments; \
             return fetch(url, {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'}, body}) \
               .then(r => r.status);";
        let statuses = [
            client
                .execute(script, vec![
                    format!("{}/queues/jobs/dead/replay", site.base).into(),
                    format!("csrf=&ids={id}").into(),
                ])
                .await
                .map_err(err)?,
            client
                .execute(
                    "const [url, token] = arguments; return fetch(url, {method: 'POST', \
                       headers: {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + token}, \
                       body: JSON.stringify({all: true})}).then(r => r.status);",
                    vec![format!("{}/api/queues/jobs/dead-letters/purge", site.base).into(), "wrong".into()],
                )
                .await
                .map_err(err)?,
        ];
        check(
            statuses == [serde_json::json!(403), serde_json::json!(401)],
            format!("the refusals answered {statuses:?}"),
        )?;
        client.goto(&site.read_only).await.map_err(err)?;
        let read_only = client
            .execute(
                "const [url, token] = arguments; return fetch(url, {method: 'POST', \
                   headers: {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + token}, \
                   body: JSON.stringify({all: true})}).then(r => r.status);",
                vec![format!("{}/api/queues/jobs/dead-letters/purge", site.read_only).into(), TOKEN.into()],
            )
            .await
            .map_err(err)?;
        check(read_only == serde_json::json!(403), format!("the read-only dashboard answered {read_only}"))?;
        let has_buttons = client
            .execute("return document.querySelectorAll('button').length", vec![])
            .await
            .map_err(err)?;
        check(has_buttons == serde_json::json!(0), "the read-only dashboard shows buttons")?;
        check(q.stats().await.unwrap().dead == before, "a refused action changed the store")
    })
}

const CASES: [(&str, Case); 5] = [
    ("counts_equal_stats", counts_equal_stats),
    ("commits_update_the_page_live", commits_update_the_page_live),
    ("a_hostile_payload_stays_text", a_hostile_payload_stays_text),
    (
        "an_action_without_the_token_is_refused",
        an_action_without_the_token_is_refused,
    ),
    (
        "replaying_a_dead_letter_moves_it",
        replaying_a_dead_letter_moves_it,
    ),
];

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // One browser, one page: the cases take turns.
    args.test_threads = Some(1);
    let required = std::env::var("RQ_TEST_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    let browser: Arc<OnceLock<Browser>> = Arc::new(OnceLock::new());
    let sites: Arc<[OnceLock<Site>; 2]> = Arc::new([OnceLock::new(), OnceLock::new()]);
    let mut trials = Vec::new();
    for (i, engine) in ["sled", "postgres"].into_iter().enumerate() {
        for (name, case) in CASES {
            let (browser, sites) = (Arc::clone(&browser), Arc::clone(&sites));
            trials.push(Trial::test(format!("{name}::{engine}"), move || {
                let browser = browser.get().ok_or("no browser")?;
                let site = sites[i].get().ok_or("no store for this engine")?;
                case(&browser.client, site)
            }));
        }
    }
    let will_run = trials
        .iter()
        .any(|t| !args.is_filtered_out(t) && !args.is_ignored(t));
    let mut banners = Vec::new();
    let mut server = None;
    if !args.list && will_run {
        match start_browser() {
            Ok(b) => {
                let _ = browser.set(b);
            }
            Err(why) if required => {
                panic!("{why} (RQ_TEST_REQUIRE_BROWSER=1 makes a missing browser a failure)")
            }
            Err(why) => banners.push(format!("browser tests SKIPPED: {why}")),
        }
        if browser.get().is_some() {
            let dir = tempfile::tempdir().expect("a directory");
            let store = Store::open(dir.path().join("store")).expect("a sled store");
            let _ = sites[0].set(site("sled", store, Some(dir)));
            match pg::PgServer::start() {
                Ok(started) => {
                    let store = started.store("browser");
                    let _ = sites[1].set(site("postgres", store, None));
                    server = Some(started);
                }
                Err(skip) => banners.push(format!("PostgreSQL browser tests SKIPPED: {skip}")),
            }
        }
    }
    let trials: Vec<Trial> = trials
        .into_iter()
        .enumerate()
        .map(|(n, t)| {
            let runnable = browser.get().is_some() && sites[n / CASES.len()].get().is_some();
            t.with_ignored_flag(!runnable)
        })
        .collect();
    for banner in &banners {
        eprintln!("\n==> {banner}\n");
    }
    let conclusion = libtest_mimic::run(&args, trials);
    for banner in &banners {
        eprintln!("==> {banner}\n");
    }
    // The stores first, then the server they use (this harness stops the one it started).
    drop(sites);
    drop(browser);
    drop(server);
    conclusion.exit_code()
}
