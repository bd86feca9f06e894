//! A live web dashboard for a [reliable-queue](reliable_queue) [`Store`], as an axum
//! [`Router`] a service nests under a path of its own server, with the JSON API behind it.
//!
//! Pages: every queue with its ready, delayed, leased, held and dead items and the age of the
//! oldest, with throughput and depth charts of the last 15 minutes, updated live; a queue's
//! items by state, paged, found by id or by text in the payload (as the service's
//! [`Decoders`] show it); an item; a queue's dead letters, with replay and purge behind a
//! confirmation. No front-end build: the HTML is rendered on the server, the little
//! JavaScript and CSS are compiled into the binary, nothing is fetched from elsewhere.
//!
//! **Load.** One task per dashboard reads the store every second (`stats()` of every queue,
//! and [`Store::activity`]) and every page, event stream and `api/stats` call is served
//! from that read: ten viewers cost the store what one does. A queue's page and the API's
//! item and dead-letter lists read the store per request, a bounded page at a time.
//!
//! **Safety.** Read-only unless [`Dashboard::admin_token`] is set. Every action is a `POST`
//! that needs the token: a browser signs in with it (a session cookie, `HttpOnly`,
//! `SameSite=Strict`) and every form carries a CSRF value and is checked for its origin;
//! the API takes `Authorization: Bearer <token>`. Values from the store are escaped in every
//! page. Page sizes are bounded ([`rows::MAX_PAGE`], [`rows::MAX_SCAN`]). Errors are pages
//! (or JSON) with a message. [`Dashboard::serve`] binds where it is told; `rq serve` binds
//! `127.0.0.1` unless told otherwise.
//!
//! # The JSON API
//!
//! Under the dashboard's path:
//!
//! | request | answer |
//! |---|---|
//! | `GET api/stats` | `[{queue, ready, delayed, leased, held, dead, oldest_ms}]`, from the last read |
//! | `GET api/history` | `[{t_ms, enqueued, done, failed, dead_lettered, ready, delayed, leased, dead}]`, a point a second, 15 minutes |
//! | `GET api/queues/{queue}/items?after=&limit=&state=&find=` | `{items: [{id, state, attempts, until_ms, enqueued_ms, shown, text, hex}], next_after, scanned}` |
//! | `GET api/queues/{queue}/items/{id}` | one item, or 404 |
//! | `GET api/queues/{queue}/dead-letters?after=&limit=` | `[{id, reason, attempts, enqueued_ms, first_attempt_ms, last_attempt_ms, shown, text, hex}]` |
//! | `POST api/queues/{queue}/dead-letters/replay` | body `{"ids": [..]}`, `{"first": n}` or `{"all": true}`, and `"reset_attempts": true` to count attempts from zero; answers `{"replayed": n}` |
//! | `POST api/queues/{queue}/dead-letters/purge` | body `{"ids": [..]}`, `{"first": n}` or `{"all": true}`; answers `{"purged": n}` |
//! | `GET events` | server-sent events: a `snapshot` event a second, the JSON of `api/stats`' read with the last chart point |
//!
//! Errors answer `{"error": message}` with a 4xx or 5xx status. `limit` is at most 500.
//!
//! # Examples
//!
//! Mounted in a service's own axum server under `/queues`:
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use reliable_queue::Store;
//! use reliable_queue_web::Dashboard;
//!
//! let store = Store::open("./data")?;
//! let dashboard = Dashboard::new(store.clone())
//!     .admin_token(std::env::var("RQ_ADMIN_TOKEN").ok())
//!     .router()?;
//! // The overview is at /queues (axum's nest does not serve /queues/).
//! let app = axum::Router::new().nest("/queues", dashboard);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{FormRejection, JsonRejection};
use axum::extract::{FromRequestParts, OriginalUri, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use reliable_queue::{Decoders, RawItem, ReliableConcurrentQueue, Replay, Store};
use serde::Deserialize;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt;

mod auth;
mod pages;
pub mod rows;
mod snapshot;

pub use snapshot::{Point, QueueRow, Snapshot};

use auth::Auth;
use pages::{Ctx, QueueQuery};
use rows::{DeadRow, Filter, MAX_PAGE};
use snapshot::Feed;

/// Why a dashboard could not be built or served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebError {
    /// [`Dashboard::router`] was called outside a tokio runtime: the dashboard's read of the
    /// store runs as a task.
    #[error("a dashboard needs a tokio runtime: call router() inside one")]
    NoRuntime,
    /// The system's random source failed (the session secret is made from it).
    #[error("the system's random source failed: {0}")]
    Random(String),
    /// Binding or serving the address failed.
    #[error("serving the dashboard failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A dashboard for a store: configure it, then take its [`router`](Dashboard::router).
#[derive(Debug)]
pub struct Dashboard {
    store: Store,
    token: Option<String>,
    decoders: Decoders,
    refresh: Duration,
    title: String,
}

impl Dashboard {
    /// A read-only dashboard for `store`, refreshed every second.
    pub fn new(store: Store) -> Dashboard {
        Dashboard {
            store,
            token: None,
            decoders: Decoders::new(),
            refresh: Duration::from_secs(1),
            title: "reliable-queue".to_owned(),
        }
    }

    /// The admin token that allows actions (replay, purge); `None` or empty: read-only.
    #[must_use]
    pub fn admin_token(mut self, token: Option<String>) -> Dashboard {
        self.token = token;
        self
    }

    /// How the pages show payloads (the service's own types); by default as
    /// [`RawItem::display`] does.
    #[must_use]
    pub fn decoders(mut self, decoders: Decoders) -> Dashboard {
        self.decoders = decoders;
        self
    }

    /// How often the store is read for the overview and the event stream (at least 100 ms;
    /// default 1 s).
    #[must_use]
    pub fn refresh(mut self, every: Duration) -> Dashboard {
        self.refresh = every.max(Duration::from_millis(100));
        self
    }

    /// The name the pages show (default `reliable-queue`).
    #[must_use]
    pub fn title(mut self, title: &str) -> Dashboard {
        title.clone_into(&mut self.title);
        self
    }

    /// The router, to nest under a path of the service's server (or serve at its root).
    /// Starts the task that reads the store, which ends when every clone of the router is
    /// dropped.
    ///
    /// # Errors
    ///
    /// [`WebError::NoRuntime`] outside a tokio runtime; [`WebError::Random`] when the
    /// system's random source fails.
    pub fn router(self) -> Result<Router, WebError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| WebError::NoRuntime)?;
        let auth = Auth::new(self.token).map_err(|e| WebError::Random(e.to_string()))?;
        let feed = snapshot::start(self.store.clone(), self.refresh, &runtime);
        let shared = Arc::new(Shared {
            store: self.store,
            feed,
            auth,
            decoders: self.decoders,
            title: self.title,
        });
        Ok(Router::new()
            .route("/", get(overview))
            .route("/queues/{queue}", get(queue_page))
            .route("/queues/{queue}/items", get(item_by_query))
            .route("/queues/{queue}/items/{id}", get(item_page))
            .route("/queues/{queue}/dead", get(dead_page))
            .route("/queues/{queue}/dead/confirm", get(confirm_page))
            .route("/queues/{queue}/dead/{id}", get(dead_one).post(dead_action))
            .route("/login", get(login_page).post(login))
            .route("/logout", post(logout))
            .route("/events", get(events))
            .route("/assets/app.js", get(script))
            .route("/assets/app.css", get(style))
            .route("/api/stats", get(api_stats))
            .route("/api/history", get(api_history))
            .route("/api/queues/{queue}/items", get(api_items))
            .route("/api/queues/{queue}/items/{id}", get(api_item))
            .route("/api/queues/{queue}/dead-letters", get(api_dead))
            .route(
                "/api/queues/{queue}/dead-letters/{action}",
                post(api_dead_action),
            )
            .fallback(not_found)
            .with_state(shared))
    }

    /// Serves the dashboard at the root of `addr` until the future is dropped.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops the server; nothing in the store is left half done (every
    /// action is one call of the store's).
    ///
    /// # Errors
    ///
    /// As [`router`](Dashboard::router); [`WebError::Io`] when `addr` cannot be bound.
    pub async fn serve(self, addr: std::net::SocketAddr) -> Result<(), WebError> {
        let app = self.router()?;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        axum::serve(listener, app).await?;
        Ok(())
    }
}

#[derive(Debug)]
struct Shared {
    store: Store,
    feed: Arc<Feed>,
    auth: Auth,
    decoders: Decoders,
    title: String,
}

type St = State<Arc<Shared>>;

/// The path the dashboard is mounted at: the request's original path less the path the
/// router saw.
struct Base(String);

impl<S: Send + Sync> FromRequestParts<S> for Base {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Base, Infallible> {
        let seen = parts.uri.path().to_owned();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map_or_else(|| seen.clone(), |o| o.0.path().to_owned());
        let base = original
            .strip_suffix(seen.as_str())
            .or_else(|| original.strip_suffix(seen.trim_end_matches('/')))
            .unwrap_or("")
            .trim_end_matches('/')
            .to_owned();
        Ok(Base(base))
    }
}

impl Shared {
    fn ctx(&self, base: &Base, headers: &HeaderMap) -> Ctx {
        let signed_in = self.auth.signed_in(headers);
        Ctx {
            base: base.0.clone(),
            writable: self.auth.writable(),
            signed_in,
            csrf: signed_in.then(|| self.auth.csrf().to_owned()),
            title: self.title.clone(),
        }
    }

    /// The queue `name`, when the store has it (a page never creates one).
    async fn queue(&self, name: &str) -> Result<ReliableConcurrentQueue<RawItem>, Failure> {
        let names = self.store.list_queues().await.map_err(Failure::store)?;
        if !names.iter().any(|n| n == name) {
            return Err(Failure::new(
                StatusCode::NOT_FOUND,
                format!("no queue {name:?} in this store"),
            ));
        }
        self.store
            .queue::<RawItem>(name)
            .await
            .map_err(Failure::store)
    }
}

/// A request that cannot be served: a status and a message for a page or JSON.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    message: String,
}

impl Failure {
    fn new(status: StatusCode, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    fn store(e: reliable_queue::Error) -> Failure {
        let status = match e {
            reliable_queue::Error::InvalidArgument { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Failure::new(status, format!("the store answered: {e}"))
    }

    fn page(self, ctx: &Ctx) -> Response {
        let title = self.status.canonical_reason().unwrap_or("Error");
        (
            self.status,
            Html(pages::error(ctx, title, &self.message).into_string()),
        )
            .into_response()
    }

    fn json(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}

/// A page, or the page that says what went wrong.
fn page(ctx: &Ctx, result: Result<maud::Markup, Failure>) -> Response {
    match result {
        Ok(page) => Html(page.into_string()).into_response(),
        Err(f) => f.page(ctx),
    }
}

/// A JSON answer, or `{"error": ...}`.
fn json<T: serde::Serialize>(result: Result<T, Failure>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(f) => f.json(),
    }
}

/// The query's pairs (later ones win; `ids` gathered).
fn query_pairs(raw: Option<&str>) -> (HashMap<String, String>, Vec<String>) {
    let mut pairs = HashMap::new();
    let mut ids = Vec::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        let (k, v) = (decode(k), decode(v));
        if k == "ids" {
            ids.push(v);
        } else {
            pairs.insert(k, v);
        }
    }
    (pairs, ids)
}

fn number(pairs: &HashMap<String, String>, key: &str) -> Result<Option<u64>, Failure> {
    match pairs.get(key).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(s) => s.parse().map(Some).map_err(|_| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                format!("{key} must be a whole number, not {s:?}"),
            )
        }),
    }
}

/// Ids from `1,2,3` lists (one or many values).
fn id_list(values: &[String]) -> Result<Vec<u64>, Failure> {
    let mut ids = Vec::new();
    for v in values {
        for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            ids.push(part.parse().map_err(|_| {
                Failure::new(
                    StatusCode::BAD_REQUEST,
                    format!("not a dead-letter id: {part:?}"),
                )
            })?);
        }
    }
    if ids.len() > MAX_PAGE {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            format!("at most {MAX_PAGE} ids at a time"),
        ));
    }
    Ok(ids)
}

fn filter_of(pairs: &HashMap<String, String>) -> Result<Filter, Failure> {
    let state = pairs.get("state").filter(|s| !s.is_empty()).cloned();
    if let Some(s) = &state {
        if !["ready", "delayed", "leased"].contains(&s.as_str()) {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "state must be ready, delayed or leased",
            ));
        }
    }
    let find = pairs.get("find").filter(|s| !s.is_empty()).cloned();
    if find.as_ref().is_some_and(|f| f.chars().count() > 200) {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "find: at most 200 characters",
        ));
    }
    Ok(Filter { state, find })
}

async fn overview(State(s): St, base: Base, headers: HeaderMap) -> Response {
    let ctx = s.ctx(&base, &headers);
    let published = s.feed.current().await;
    Html(pages::overview(&ctx, &published.snapshot).into_string()).into_response()
}

async fn queue_page(
    State(s): St,
    base: Base,
    headers: HeaderMap,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let ctx = s.ctx(&base, &headers);
    let run = async {
        let (pairs, _) = query_pairs(raw.as_deref());
        let after = number(&pairs, "after")?;
        let filter = filter_of(&pairs)?;
        let q = s.queue(&name).await?;
        let page = rows::scan(&q, &name, after, 50, &filter, &s.decoders)
            .await
            .map_err(Failure::store)?;
        let stats = q.stats().await.map_err(Failure::store)?;
        let row = QueueRow::new(name.clone(), &stats, std::time::SystemTime::now());
        let query = QueueQuery {
            state: filter.state,
            find: filter.find,
        };
        Ok::<_, Failure>(pages::queue(&ctx, Some(&row), &name, &query, &page))
    };
    page(&ctx, run.await)
}

async fn item_by_query(
    State(s): St,
    base: Base,
    headers: HeaderMap,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let ctx = s.ctx(&base, &headers);
    let (pairs, _) = query_pairs(raw.as_deref());
    match number(&pairs, "id") {
        Ok(Some(id)) => Redirect::to(&format!(
            "{}/queues/{}/items/{id}",
            ctx.base,
            rows::segment(&name)
        ))
        .into_response(),
        Ok(None) => Failure::new(StatusCode::BAD_REQUEST, "give an item id").page(&ctx),
        Err(f) => f.page(&ctx),
    }
}

async fn item_page(
    State(s): St,
    base: Base,
    headers: HeaderMap,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let ctx = s.ctx(&base, &headers);
    let run = async {
        let id: u64 = id
            .parse()
            .map_err(|_| Failure::new(StatusCode::BAD_REQUEST, "an item id is a whole number"))?;
        let q = s.queue(&name).await?;
        match rows::item(&q, &name, id, &s.decoders)
            .await
            .map_err(Failure::store)?
        {
            Some(item) => Ok(pages::item(&ctx, &name, &item)),
            None => Err(Failure::new(
                StatusCode::NOT_FOUND,
                format!("no item {id} in queue {name:?} (done, dead, or never there)"),
            )),
        }
    };
    page(&ctx, run.await)
}

async fn dead_rows(
    s: &Shared,
    name: &str,
    after: Option<u64>,
    limit: usize,
) -> Result<(Vec<DeadRow>, Option<u64>), Failure> {
    let q = s.queue(name).await?;
    let limit = limit.clamp(1, MAX_PAGE);
    let letters = q.dead_letters(after, limit).await.map_err(Failure::store)?;
    let next = (letters.len() == limit)
        .then(|| letters.last().map(|d| d.id))
        .flatten();
    Ok((
        letters
            .iter()
            .map(|d| DeadRow::new(name, d, &s.decoders))
            .collect(),
        next,
    ))
}

async fn dead_page(
    State(s): St,
    base: Base,
    headers: HeaderMap,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let ctx = s.ctx(&base, &headers);
    let run = async {
        let (pairs, _) = query_pairs(raw.as_deref());
        let after = number(&pairs, "after")?;
        let (rows, next) = dead_rows(&s, &name, after, 50).await?;
        let done = pairs.get("done").map(|d| rows::cut(d.clone(), 200));
        Ok::<_, Failure>(pages::dead_letters(
            &ctx,
            &name,
            &rows,
            next,
            done.as_deref(),
        ))
    };
    page(&ctx, run.await)
}

async fn dead_one(
    State(s): St,
    base: Base,
    headers: HeaderMap,
    Path((name, id)): Path<(String, String)>,
) -> Response {
    let ctx = s.ctx(&base, &headers);
    let run = async {
        let id: u64 = id.parse().map_err(|_| {
            Failure::new(
                StatusCode::BAD_REQUEST,
                "a dead-letter id is a whole number",
            )
        })?;
        let (rows, _) = dead_rows(&s, &name, id.checked_sub(1), 1).await?;
        match rows.into_iter().find(|d| d.id == id) {
            Some(d) => Ok(pages::dead_letter(&ctx, &name, &d)),
            None => Err(Failure::new(
                StatusCode::NOT_FOUND,
                format!("no dead letter {id} in queue {name:?}"),
            )),
        }
    };
    page(&ctx, run.await)
}

async fn confirm_page(
    State(s): St,
    base: Base,
    headers: HeaderMap,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
) -> Response {
    let ctx = s.ctx(&base, &headers);
    let run = async {
        if !ctx.signed_in {
            return Err(Failure::new(
                StatusCode::FORBIDDEN,
                "sign in with the admin token first",
            ));
        }
        let (pairs, ids) = query_pairs(raw.as_deref());
        let action = pairs.get("action").map_or("", String::as_str);
        if !["replay", "purge", "replay-all", "purge-all"].contains(&action) {
            return Err(Failure::new(StatusCode::BAD_REQUEST, "no such action"));
        }
        let ids = id_list(&ids)?;
        if !action.ends_with("-all") && ids.is_empty() {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "select at least one dead letter",
            ));
        }
        s.queue(&name).await?;
        Ok(pages::confirm(&ctx, &name, action, &ids))
    };
    page(&ctx, run.await)
}

#[derive(Debug, Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    ids: String,
    #[serde(default)]
    all: Option<String>,
}

async fn dead_action(
    State(s): St,
    base: Base,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let ctx = s.ctx(&base, &headers);
    let run = async {
        let Ok(Form(form)) = form else {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "the form could not be read",
            ));
        };
        if let Some(why) = s.auth.refuse_form(&headers, &form.csrf) {
            return Err(Failure::new(StatusCode::FORBIDDEN, why));
        }
        let which = if form.all.is_some() {
            Replay::All
        } else {
            let ids = id_list(&[form.ids])?;
            if ids.is_empty() {
                return Err(Failure::new(
                    StatusCode::BAD_REQUEST,
                    "no dead letters given",
                ));
            }
            Replay::Ids(ids)
        };
        let q = s.queue(&name).await?;
        let done = match action.as_str() {
            "replay" => format!(
                "Replayed {}.",
                q.replay(which, true).await.map_err(Failure::store)?
            ),
            "purge" => format!("Purged {}.", q.purge(which).await.map_err(Failure::store)?),
            _ => return Err(Failure::new(StatusCode::NOT_FOUND, "no such action")),
        };
        Ok(Redirect::to(&format!(
            "{}/queues/{}/dead?done={}",
            ctx.base,
            rows::segment(&name),
            rows::segment(&done)
        )))
    };
    run.await
        .map_or_else(|f| f.page(&ctx), IntoResponse::into_response)
}

async fn login_page(State(s): St, base: Base, headers: HeaderMap) -> Response {
    let ctx = s.ctx(&base, &headers);
    Html(pages::login(&ctx, None).into_string()).into_response()
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

async fn login(
    State(s): St,
    base: Base,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let ctx = s.ctx(&base, &headers);
    let token = form.map(|Form(f)| f.token).unwrap_or_default();
    if !auth::same_origin(&headers) {
        return Failure::new(StatusCode::FORBIDDEN, "the request came from another site")
            .page(&ctx);
    }
    if !s.auth.token_is(&token) {
        return (
            StatusCode::FORBIDDEN,
            Html(pages::login(&ctx, Some("That is not the admin token.")).into_string()),
        )
            .into_response();
    }
    let path = if ctx.base.is_empty() {
        "/".to_owned()
    } else {
        ctx.base.clone()
    };
    let cookie = format!(
        "{}={}; Path={path}; HttpOnly; SameSite=Strict",
        auth::COOKIE,
        s.auth.session()
    );
    let mut response = Redirect::to(&ctx.home()).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn logout(
    State(s): St,
    base: Base,
    headers: HeaderMap,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    let ctx = s.ctx(&base, &headers);
    let csrf = form.map(|Form(f)| f.csrf).unwrap_or_default();
    if let Some(why) = s.auth.refuse_form(&headers, &csrf) {
        return Failure::new(StatusCode::FORBIDDEN, why).page(&ctx);
    }
    let path = if ctx.base.is_empty() {
        "/".to_owned()
    } else {
        ctx.base.clone()
    };
    let cookie = format!(
        "{}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0",
        auth::COOKIE
    );
    let mut response = Redirect::to(&ctx.home()).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn events(State(s): St) -> Sse<impl tokio_stream::Stream<Item = Result<Event, Infallible>>> {
    let stream = WatchStream::new(s.feed.updates())
        .filter(|published| published.read)
        .map(|published| Ok(Event::default().event("snapshot").data(&*published.json)));
    Sse::new(stream).keep_alive(KeepAlive::default())
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("../assets/app.js"),
    )
        .into_response()
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("../assets/app.css"),
    )
        .into_response()
}

async fn not_found(State(s): St, base: Base, headers: HeaderMap) -> Response {
    let ctx = s.ctx(&base, &headers);
    Failure::new(StatusCode::NOT_FOUND, "there is no such page").page(&ctx)
}

async fn api_stats(State(s): St) -> Response {
    Json(s.feed.current().await.snapshot.queues.clone()).into_response()
}

async fn api_history(State(s): St) -> Response {
    let history: Vec<Point> = s.feed.history.lock().iter().copied().collect();
    Json(history).into_response()
}

async fn api_items(State(s): St, Path(name): Path<String>, RawQuery(raw): RawQuery) -> Response {
    let run = async {
        let (pairs, _) = query_pairs(raw.as_deref());
        let after = number(&pairs, "after")?;
        let limit = usize::try_from(number(&pairs, "limit")?.unwrap_or(100)).unwrap_or(MAX_PAGE);
        let filter = filter_of(&pairs)?;
        let q = s.queue(&name).await?;
        rows::scan(&q, &name, after, limit, &filter, &s.decoders)
            .await
            .map_err(Failure::store)
    };
    json(run.await)
}

async fn api_item(State(s): St, Path((name, id)): Path<(String, String)>) -> Response {
    let run = async {
        let id: u64 = id
            .parse()
            .map_err(|_| Failure::new(StatusCode::BAD_REQUEST, "an item id is a whole number"))?;
        let q = s.queue(&name).await?;
        rows::item(&q, &name, id, &s.decoders)
            .await
            .map_err(Failure::store)?
            .ok_or_else(|| Failure::new(StatusCode::NOT_FOUND, format!("no item {id}")))
    };
    json(run.await)
}

async fn api_dead(State(s): St, Path(name): Path<String>, RawQuery(raw): RawQuery) -> Response {
    let run = async {
        let (pairs, _) = query_pairs(raw.as_deref());
        let after = number(&pairs, "after")?;
        let limit = usize::try_from(number(&pairs, "limit")?.unwrap_or(100)).unwrap_or(MAX_PAGE);
        dead_rows(&s, &name, after, limit).await
    };
    json(run.await.map(|(rows, _)| rows))
}

#[derive(Debug, Deserialize)]
struct ApiAction {
    #[serde(default)]
    ids: Vec<u64>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    first: Option<usize>,
    #[serde(default)]
    reset_attempts: bool,
}

async fn api_dead_action(
    State(s): St,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    body: Result<Json<ApiAction>, JsonRejection>,
) -> Response {
    let run = async {
        if !s.auth.writable() {
            return Err(Failure::new(
                StatusCode::FORBIDDEN,
                "this dashboard is read-only: no admin token is configured",
            ));
        }
        if !s.auth.bearer(&headers) {
            return Err(Failure::new(
                StatusCode::UNAUTHORIZED,
                "give the admin token as Authorization: Bearer <token>",
            ));
        }
        let Ok(Json(body)) = body else {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                "the body must be JSON: {\"ids\": [..]} or {\"all\": true}",
            ));
        };
        if body.ids.len() > MAX_PAGE {
            return Err(Failure::new(
                StatusCode::BAD_REQUEST,
                format!("at most {MAX_PAGE} ids"),
            ));
        }
        let which = match (body.all, body.ids.is_empty(), body.first) {
            (true, true, None) => Replay::All,
            (false, false, None) => Replay::Ids(body.ids),
            (false, true, Some(n)) if n > 0 => Replay::First(n),
            _ => {
                return Err(Failure::new(
                    StatusCode::BAD_REQUEST,
                    "give one of ids (a list), first (a number above 0) or all (true)",
                ))
            }
        };
        let reset = body.reset_attempts;
        let q = s.queue(&name).await?;
        match action.as_str() {
            "replay" => Ok(serde_json::json!({
                "replayed": q.replay(which, reset).await.map_err(Failure::store)?
            })),
            "purge" => Ok(serde_json::json!({
                "purged": q.purge(which).await.map_err(Failure::store)?
            })),
            _ => Err(Failure::new(StatusCode::NOT_FOUND, "no such action")),
        }
    };
    json(run.await)
}
