//! Who may act. Reading needs nothing (the dashboard binds loopback unless told otherwise);
//! every action needs the admin token, and none exists unless one is configured.
//!
//! - A page's actions need a signed-in browser: `POST login` with the token sets a session
//!   cookie (`HttpOnly`, `SameSite=Strict`) holding a secret made at random when the dashboard
//!   was built, and every action's form carries a CSRF value derived from that secret. An
//!   action is done only when the cookie, the form's CSRF value and the request's origin
//!   (`Origin`, `Sec-Fetch-Site` when the browser sends them) all check.
//! - The JSON API's actions need `Authorization: Bearer <token>`: a header a browser never
//!   adds by itself, so a cross-site page cannot make one.
//!
//! Secrets are compared in constant time.

use axum::http::HeaderMap;
use sha2::{Digest, Sha256};

/// The name of the session cookie.
pub(crate) const COOKIE: &str = "rq_session";

/// The admin token and the secrets derived for this dashboard.
#[derive(Clone)]
pub(crate) struct Auth {
    /// `None`: read-only.
    token: Option<String>,
    /// The session cookie's value (hex of 32 random bytes).
    session: String,
    /// The CSRF value every action form carries.
    csrf: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .finish_non_exhaustive()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `a == b`, in time that depends on their lengths only.
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Auth {
    /// With `token` (`None`: read-only); the session secret from the system's random source.
    pub(crate) fn new(token: Option<String>) -> Result<Auth, getrandom::Error> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)?;
        let session = hex(&secret);
        let csrf = hex(&Sha256::digest(format!("csrf:{session}").as_bytes()));
        Ok(Auth {
            token: token.filter(|t| !t.is_empty()),
            session,
            csrf,
        })
    }

    /// Whether actions exist at all.
    pub(crate) fn writable(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `given` is the admin token.
    pub(crate) fn token_is(&self, given: &str) -> bool {
        self.token.as_deref().is_some_and(|t| same(t, given))
    }

    /// The session cookie's value, for a browser that gave the token.
    pub(crate) fn session(&self) -> &str {
        &self.session
    }

    /// The CSRF value for forms.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Whether the request carries this dashboard's session cookie.
    pub(crate) fn signed_in(&self, headers: &HeaderMap) -> bool {
        self.writable() && cookie(headers, COOKIE).is_some_and(|value| same(&value, &self.session))
    }

    /// Whether the API request carries `Authorization: Bearer <token>`.
    pub(crate) fn bearer(&self, headers: &HeaderMap) -> bool {
        headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| self.token_is(t.trim()))
    }

    /// Why a form's action must be refused, if it must: not signed in, a CSRF value that
    /// does not check, or a request from another site.
    pub(crate) fn refuse_form(&self, headers: &HeaderMap, csrf: &str) -> Option<&'static str> {
        if !self.writable() {
            return Some("this dashboard is read-only: no admin token is configured");
        }
        if !self.signed_in(headers) {
            return Some("sign in with the admin token first");
        }
        if !same(csrf, &self.csrf) {
            return Some("the form's CSRF check failed: reload the page and try again");
        }
        if !same_origin(headers) {
            return Some("the request came from another site");
        }
        None
    }
}

/// Whether the request's `Sec-Fetch-Site` and `Origin`, when the browser sends them, say it
/// came from this dashboard's own pages.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        if site != "same-origin" && site != "none" {
            return false;
        }
    }
    match (header("origin"), header("host")) {
        (Some(origin), Some(host)) => {
            origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                == Some(host)
        }
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// The value of cookie `name` in the request.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_form_needs_the_cookie_the_csrf_value_and_the_same_origin() {
        let auth = Auth::new(Some("s3cret".to_owned())).unwrap();
        let cookie = format!("a=b; {COOKIE}={}", auth.session());
        let good = headers(&[
            ("cookie", &cookie),
            ("origin", "http://127.0.0.1:7878"),
            ("host", "127.0.0.1:7878"),
            ("sec-fetch-site", "same-origin"),
        ]);
        assert_eq!(auth.refuse_form(&good, auth.csrf()), None);
        assert!(auth.refuse_form(&good, "wrong").is_some());
        let no_cookie = headers(&[("host", "127.0.0.1:7878")]);
        assert!(auth.refuse_form(&no_cookie, auth.csrf()).is_some());
        let other_site = headers(&[
            ("cookie", &cookie),
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:7878"),
        ]);
        assert!(auth.refuse_form(&other_site, auth.csrf()).is_some());
        let cross = headers(&[("cookie", &cookie), ("sec-fetch-site", "cross-site")]);
        assert!(auth.refuse_form(&cross, auth.csrf()).is_some());
    }

    #[test]
    fn without_a_token_nothing_is_writable() {
        let auth = Auth::new(None).unwrap();
        let cookie = format!("{COOKIE}={}", auth.session());
        let h = headers(&[("cookie", &cookie), ("authorization", "Bearer ")]);
        assert!(!auth.signed_in(&h));
        assert!(!auth.bearer(&h));
        assert!(auth.refuse_form(&h, auth.csrf()).is_some());
        assert!(!Auth::new(Some(String::new())).unwrap().writable());
    }

    #[test]
    fn the_bearer_token_is_checked() {
        let auth = Auth::new(Some("s3cret".to_owned())).unwrap();
        assert!(auth.bearer(&headers(&[("authorization", "Bearer s3cret")])));
        assert!(!auth.bearer(&headers(&[("authorization", "Bearer s3cre")])));
        assert!(!auth.bearer(&headers(&[("authorization", "s3cret")])));
    }
}
