//! CORS for browser front-ends (`--allowed-origins`), through `tower-http`'s `CorsLayer`: off by default (no CORS
//! header at all); on, preflights are answered before auth and the body checks, as browsers send no
//! `Authorization` on a preflight. Settings follow vLLM's (Starlette's `CORSMiddleware` with `allow_headers=["*"]`).

use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderName, HeaderValue, Method};
use std::time::Duration;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// How long a browser may cache a preflight answer: 600 s, Starlette's default.
pub const PREFLIGHT_MAX_AGE: Duration = Duration::from_secs(600);

/// The origins a browser page may call the API from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Origins {
    /// No CORS headers (the default): browsers refuse cross-origin reads.
    #[default]
    Off,
    /// `*`: every origin (`Access-Control-Allow-Origin: *`).
    Any,
    /// Exactly these origins (`scheme://host[:port]`), echoed back when they match.
    List(Vec<String>),
}

/// A `--allowed-origins` value that is not `*` or a comma list of `scheme://host[:port]` origins.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--allowed-origins: {0}")]
pub struct OriginsError(String);

impl Origins {
    /// Parses `--allowed-origins`: `*`, or origins separated by commas (`http://localhost:3000,https://app.example`).
    /// Errors: an empty list, `*` beside others, an origin without `http://` / `https://`, with a path or a trailing
    /// slash (browsers send none), or with bytes a header cannot carry.
    pub fn parse(s: &str) -> Result<Self, OriginsError> {
        let items: Vec<&str> = s.split(',').map(str::trim).filter(|o| !o.is_empty()).collect();
        if items.is_empty() {
            return Err(OriginsError("no origin given (use `*` for every origin)".into()));
        }
        if items.contains(&"*") {
            return match items.len() {
                1 => Ok(Self::Any),
                _ => Err(OriginsError("`*` allows every origin and cannot be listed beside others".into())),
            };
        }
        items.iter().map(|o| origin(o)).collect::<Result<Vec<_>, _>>().map(Self::List)
    }

    /// The layer over the router, `None` when CORS is off.
    pub fn layer(&self) -> Option<CorsLayer> {
        let allow = match self {
            Self::Off => return None,
            Self::Any => AllowOrigin::any(),
            // Each was checked to be a valid header value by `parse`; one that is not is skipped.
            Self::List(list) => AllowOrigin::list(list.iter().filter_map(|o| HeaderValue::from_str(o).ok())),
        };
        let vary =
            ["origin", "access-control-request-method", "access-control-request-headers"].map(HeaderName::from_static);
        let layer = CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            // The headers the preflight asks for (authorization, content-type, the openai SDKs' x-stainless-*).
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([RETRY_AFTER])
            .max_age(PREFLIGHT_MAX_AGE)
            .vary(vary);
        Some(layer)
    }
}

/// One origin, checked: `http(s)://host[:port]` with no path.
fn origin(o: &str) -> Result<String, OriginsError> {
    let rest = o.strip_prefix("http://").or_else(|| o.strip_prefix("https://"));
    let Some(host) = rest else {
        return Err(OriginsError(format!("`{o}` is not an origin: it must start with http:// or https://")));
    };
    if host.is_empty() || host.contains('/') {
        return Err(OriginsError(format!(
            "`{o}` is not an origin: scheme://host[:port] only, with no path or trailing slash"
        )));
    }
    if HeaderValue::from_str(o).is_err() || o.contains(char::is_whitespace) {
        return Err(OriginsError(format!("`{o}` has characters an Origin header cannot carry")));
    }
    Ok(o.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse_to_any_a_list_or_a_named_error() {
        assert_eq!(Origins::parse("*"), Ok(Origins::Any));
        assert_eq!(
            Origins::parse("http://localhost:3000, https://app.example"),
            Ok(Origins::List(vec!["http://localhost:3000".into(), "https://app.example".into()]))
        );
        for (bad, says) in [
            ("", "no origin"),
            ("*,http://a", "cannot be listed"),
            ("localhost:3000", "must start with http"),
            ("http://a/", "no path or trailing slash"),
            ("https://a/b", "no path"),
        ] {
            let e = Origins::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(says) && e.starts_with("--allowed-origins"), "{bad}: {e}");
        }
        assert!(Origins::Off.layer().is_none());
    }
}
