//! The HTML pages, rendered on the server with maud (which escapes every value it is given:
//! a payload of `<script>` shows as text). Links are built from the path the dashboard is
//! mounted at, so it works under any prefix.

use std::time::{Duration, SystemTime};

use maud::{html, Markup, DOCTYPE};

use crate::rows::{human, segment, DeadRow, ItemPage, ItemRow, MAX_SCAN};
use crate::snapshot::{QueueRow, Snapshot};

/// What every page needs to know of the request.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// The path the dashboard is mounted at, without a trailing `/` (empty at the root).
    pub(crate) base: String,
    /// Whether actions exist (an admin token is configured).
    pub(crate) writable: bool,
    /// Whether this browser is signed in.
    pub(crate) signed_in: bool,
    /// The CSRF value for forms (only given to a signed-in browser).
    pub(crate) csrf: Option<String>,
    /// The page's title prefix.
    pub(crate) title: String,
}

impl Ctx {
    /// The overview's URL: the mount path itself (axum's `nest` serves `/prefix`, not
    /// `/prefix/`), or `/` at the root.
    pub(crate) fn home(&self) -> String {
        if self.base.is_empty() {
            "/".to_owned()
        } else {
            self.base.clone()
        }
    }

    fn queue_url(&self, queue: &str) -> String {
        format!("{}/queues/{}", self.base, segment(queue))
    }
}

/// A time as "in 4m05s" or "12s ago", relative to now.
fn when(ms: Option<u64>) -> String {
    let Some(ms) = ms else { return "-".to_owned() };
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    let now = SystemTime::now();
    match t.duration_since(now) {
        Ok(ahead) => format!("in {}", human(ahead)),
        Err(_) => format!("{} ago", human(now.duration_since(t).unwrap_or_default())),
    }
}

fn layout(ctx: &Ctx, title: &str, body: Markup) -> Markup {
    let base = &ctx.base;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (ctx.title) " · " (title) }
                link rel="stylesheet" href=(format!("{base}/assets/app.css"));
            }
            body data-base=(base) {
                header {
                    a.brand href=(ctx.home()) { (ctx.title) }
                    nav {
                        a href=(ctx.home()) { "Queues" }
                        @if ctx.writable {
                            @if ctx.signed_in {
                                form.inline method="post" action=(format!("{base}/logout")) {
                                    input type="hidden" name="csrf" value=(ctx.csrf.clone().unwrap_or_default());
                                    button type="submit" { "Sign out" }
                                }
                            } @else {
                                a href=(format!("{base}/login")) { "Sign in" }
                            }
                        } @else {
                            span.muted title="No admin token is configured: nothing here can change the store." { "read-only" }
                        }
                    }
                }
                main { (body) }
                script src=(format!("{base}/assets/app.js")) {}
            }
        }
    }
}

/// A page that says what went wrong.
pub(crate) fn error(ctx: &Ctx, title: &str, message: &str) -> Markup {
    layout(
        ctx,
        title,
        html! {
            h1 { (title) }
            p.error { (message) }
            p { a href=(ctx.home()) { "Back to the queues" } }
        },
    )
}

fn queue_cells(ctx: &Ctx, q: &QueueRow) -> Markup {
    html! {
        tr data-queue=(q.queue) {
            td { a href=(ctx.queue_url(&q.queue)) { (q.queue) } }
            td.n data-field="ready" { (q.ready) }
            td.n data-field="delayed" { (q.delayed) }
            td.n data-field="leased" { (q.leased) }
            td.n data-field="held" { (q.held) }
            td.n data-field="dead" {
                @if q.dead > 0 {
                    a href=(format!("{}/dead", ctx.queue_url(&q.queue))) { (q.dead) }
                } @else { (q.dead) }
            }
            td.n data-field="oldest" { (q.oldest_ms.map_or_else(|| "-".to_owned(), |ms| human(Duration::from_millis(ms)))) }
        }
    }
}

/// Every queue with its figures, and the charts (drawn by app.js, fed by `events`).
pub(crate) fn overview(ctx: &Ctx, snapshot: &Snapshot) -> Markup {
    layout(
        ctx,
        "Queues",
        html! {
            h1 { "Queues" }
            p.status #status {
                @if let Some(e) = &snapshot.error { span.error { (e) } } @else {
                    "Updated live, every second."
                }
            }
            div.scroll {
                table #queues {
                    thead { tr {
                        th { "Queue" } th.n { "Ready" } th.n { "Delayed" } th.n { "Leased" }
                        th.n { "Held" } th.n { "Dead" } th.n { "Oldest" }
                    } }
                    tbody {
                        @for q in &snapshot.queues { (queue_cells(ctx, q)) }
                    }
                }
            }
            @if snapshot.queues.is_empty() { p.muted #empty { "No queues yet." } }
            section.charts {
                figure {
                    figcaption { "Throughput, items per second (last 15 minutes) " span.muted.small #throughput-max {} }
                    svg #throughput viewBox="0 0 600 160" preserveAspectRatio="none" role="img" aria-label="throughput chart" {}
                    p.legend {
                        span.k.s0 { "enqueued" } " " span.k.s1 { "done" } " "
                        span.k.s2 { "failed" } " " span.k.s3 { "dead-lettered" }
                    }
                }
                figure {
                    figcaption { "Depth, all queues (last 15 minutes) " span.muted.small #depth-max {} }
                    svg #depth viewBox="0 0 600 160" preserveAspectRatio="none" role="img" aria-label="depth chart" {}
                    p.legend {
                        span.k.s0 { "ready" } " " span.k.s1 { "delayed" } " "
                        span.k.s2 { "leased" } " " span.k.s3 { "dead" }
                    }
                }
                p.muted.small {
                    "Enqueued, done and failed count what this process committed through this store; "
                    "depths and dead letters are the store's, whoever wrote them."
                }
            }
        },
    )
}

fn item_rows(ctx: &Ctx, queue: &str, items: &[ItemRow]) -> Markup {
    html! {
        div.scroll { table.items {
            thead { tr { th.n { "Id" } th { "State" } th.n { "Attempts" } th { "Enqueued" } th { "Until" } th { "Payload" } } }
            tbody {
                @for i in items {
                    tr {
                        td.n { a href=(format!("{}/items/{}", ctx.queue_url(queue), i.id)) { (i.id) } }
                        td { span class=(format!("state {}", i.state)) { (i.state) } }
                        td.n { (i.attempts) }
                        td { (when(i.enqueued_ms)) }
                        td { (when(i.until_ms)) }
                        td.payload { code { (crate::rows::cut(i.shown.clone(), 120)) } }
                    }
                }
            }
        } }
    }
}

/// The query of a queue's page, kept in its links.
#[derive(Debug, Default, Clone)]
pub(crate) struct QueueQuery {
    pub(crate) state: Option<String>,
    pub(crate) find: Option<String>,
}

/// A queue: its figures, and its items by state, paged, found by id or text.
pub(crate) fn queue(
    ctx: &Ctx,
    row: Option<&QueueRow>,
    name: &str,
    query: &QueueQuery,
    page: &ItemPage,
) -> Markup {
    let url = ctx.queue_url(name);
    let state = query.state.clone().unwrap_or_default();
    let find = query.find.clone().unwrap_or_default();
    let next = page.next_after.map(|after| {
        let mut link = format!("{url}?after={after}");
        if !state.is_empty() {
            link.push_str(&format!("&state={}", segment(&state)));
        }
        if !find.is_empty() {
            link.push_str(&format!("&find={}", segment(&find)));
        }
        link
    });
    layout(
        ctx,
        name,
        html! {
            h1 { "Queue " code { (name) } }
            @if let Some(q) = row {
                div.scroll { table #queues { tbody { (queue_cells(ctx, q)) } } }
            }
            p { a href=(format!("{url}/dead")) { "Dead letters" } }
            form.filters method="get" action=(url) {
                label { "State " select name="state" {
                    @for (value, label) in [("", "any"), ("ready", "ready"), ("delayed", "delayed"), ("leased", "leased")] {
                        option value=(value) selected[state == value] { (label) }
                    }
                } }
                label { "Text " input type="search" name="find" value=(find) maxlength="200"; }
                button type="submit" { "Show" }
            }
            form.filters method="get" action=(format!("{url}/items")) {
                label { "Item id " input type="number" name="id" min="0"; }
                button type="submit" { "Open" }
            }
            (item_rows(ctx, name, &page.items))
            @if page.items.is_empty() { p.muted { "No items here." } }
            p.muted.small {
                "Read " (page.scanned) " items"
                @if page.scanned >= MAX_SCAN { " (a page reads at most " (MAX_SCAN) ")" }
                "."
            }
            @if let Some(next) = next { p { a href=(next) { "Next page" } } }
        },
    )
}

/// One item.
pub(crate) fn item(ctx: &Ctx, queue: &str, item: &ItemRow) -> Markup {
    layout(
        ctx,
        &format!("{queue} #{}", item.id),
        html! {
            h1 { "Item " (item.id) " of " a href=(ctx.queue_url(queue)) { code { (queue) } } }
            dl {
                dt { "State" } dd { span class=(format!("state {}", item.state)) { (item.state) } }
                dt { "Attempts" } dd { (item.attempts) }
                dt { "Enqueued" } dd { (when(item.enqueued_ms)) }
                @if item.state == "delayed" { dt { "Due" } dd { (when(item.until_ms)) } }
                @if item.state == "leased" {
                    dt { "Lease deadline" } dd { (when(item.until_ms)) }
                    dt { "Fencing token" } dd { (item.id) }
                }
            }
            h2 { "Payload" }
            pre.payload { (item.shown) }
            details { summary { "Encoded bytes (hex)" } pre.payload { (item.hex) } }
        },
    )
}

/// A queue's dead letters, with the actions for a signed-in browser.
pub(crate) fn dead_letters(
    ctx: &Ctx,
    queue: &str,
    rows: &[DeadRow],
    next_after: Option<u64>,
    done: Option<&str>,
) -> Markup {
    let url = ctx.queue_url(queue);
    let can_act = ctx.writable && ctx.signed_in;
    layout(
        ctx,
        &format!("{queue} dead letters"),
        html! {
            h1 { "Dead letters of " a href=(url) { code { (queue) } } }
            @if let Some(done) = done { p.done #done { (done) } }
            @if ctx.writable && !ctx.signed_in {
                p.muted { a href=(format!("{}/login", ctx.base)) { "Sign in" } " to replay or purge." }
            }
            form #dead method="get" action=(format!("{url}/dead/confirm")) {
                div.scroll { table.items {
                    thead { tr {
                        @if can_act { th { "" } }
                        th.n { "Id" } th { "Reason" } th.n { "Attempts" } th { "Last attempt" } th { "Payload" }
                    } }
                    tbody {
                        @for d in rows {
                            tr data-id=(d.id) {
                                @if can_act { td { input type="checkbox" name="ids" value=(d.id) aria-label="select"; } }
                                td.n { a href=(format!("{url}/dead/{}", d.id)) { (d.id) } }
                                td { (crate::rows::cut(d.reason.clone(), 80)) }
                                td.n { (d.attempts) }
                                td { (when(d.last_attempt_ms)) }
                                td.payload { code { (crate::rows::cut(d.shown.clone(), 120)) } }
                            }
                        }
                    }
                } }
                @if rows.is_empty() { p.muted #none { "No dead letters." } }
                @if can_act && !rows.is_empty() {
                    p.actions {
                        button type="submit" name="action" value="replay" { "Replay selected" }
                        button type="submit" name="action" value="purge" { "Purge selected" }
                        button type="submit" name="action" value="replay-all" { "Replay all" }
                        button type="submit" name="action" value="purge-all" { "Purge all" }
                    }
                }
            }
            @if let Some(after) = next_after { p { a href=(format!("{url}/dead?after={after}")) { "Next page" } } }
        },
    )
}

/// One dead letter.
pub(crate) fn dead_letter(ctx: &Ctx, queue: &str, d: &DeadRow) -> Markup {
    let url = ctx.queue_url(queue);
    layout(
        ctx,
        &format!("{queue} dead letter {}", d.id),
        html! {
            h1 { "Dead letter " (d.id) " of " a href=(url) { code { (queue) } } }
            dl {
                dt { "Reason" } dd { (d.reason) }
                dt { "Attempts" } dd { (d.attempts) }
                dt { "Enqueued" } dd { (when(d.enqueued_ms)) }
                dt { "First attempt" } dd { (when(d.first_attempt_ms)) }
                dt { "Last attempt" } dd { (when(d.last_attempt_ms)) }
            }
            h2 { "Payload" }
            pre.payload { (d.shown) }
            details { summary { "Encoded bytes (hex)" } pre.payload { (d.hex) } }
            p { a href=(format!("{url}/dead")) { "All dead letters" } }
        },
    )
}

/// What an action will do, and the form that does it.
pub(crate) fn confirm(ctx: &Ctx, queue: &str, action: &str, ids: &[u64]) -> Markup {
    let url = ctx.queue_url(queue);
    let (verb, all) = match action {
        "replay-all" => ("Replay", true),
        "purge-all" => ("Purge", true),
        "purge" => ("Purge", false),
        _ => ("Replay", false),
    };
    let what = if all {
        "every dead letter of this queue".to_owned()
    } else {
        format!(
            "{} dead letter{} ({})",
            ids.len(),
            if ids.len() == 1 { "" } else { "s" },
            ids.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let effect = if verb == "Replay" {
        "They go back to the queue's tail, with their attempts reset."
    } else {
        "They are deleted for good."
    };
    layout(
        ctx,
        "Confirm",
        html! {
            h1 { (verb) " " (what) " of " code { (queue) } "?" }
            p { (effect) }
            form method="post" action=(format!("{url}/dead/{}", if verb == "Replay" { "replay" } else { "purge" })) {
                input type="hidden" name="csrf" value=(ctx.csrf.clone().unwrap_or_default());
                @if all { input type="hidden" name="all" value="1"; }
                input type="hidden" name="ids" value=(ids.iter().map(u64::to_string).collect::<Vec<_>>().join(","));
                button.danger #confirm type="submit" { (verb) }
                " "
                a href=(format!("{url}/dead")) { "Cancel" }
            }
        },
    )
}

/// The sign-in form.
pub(crate) fn login(ctx: &Ctx, message: Option<&str>) -> Markup {
    layout(
        ctx,
        "Sign in",
        html! {
            h1 { "Sign in" }
            @if let Some(m) = message { p.error { (m) } }
            @if ctx.writable {
                form method="post" action=(format!("{}/login", ctx.base)) {
                    label { "Admin token " input type="password" name="token" autocomplete="current-password" required; }
                    button type="submit" { "Sign in" }
                }
            } @else {
                p { "This dashboard is read-only: no admin token is configured." }
            }
        },
    )
}
