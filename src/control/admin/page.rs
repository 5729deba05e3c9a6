//! The status page, `GET /admin/`: one self-contained HTML page (`page.html`: inline style and
//! script, no external asset, works offline) that asks for the admin token once, keeps it in
//! the page's memory and sends it as `Authorization: Bearer` to `/admin/config`,
//! `/admin/keys`, `/admin/usage` and `/metrics` every 3 s: models and deployments with breaker
//! state, attempts, failures and engine signals; keys with usage, spend and budget; admission
//! budget and cache use; request and 5xx rates; config generation and reloads.
//!
//! The page itself holds no data, so it is served without the token; every value it shows
//! comes from a request that needs it. Its Content-Security-Policy allows no source but its
//! own inline code and this listener (`connect-src 'self'`), and no framing.
//!
//! Owns: the page and its headers. Must not: put data or the token into the page or a URL.

use super::Reply;

const PAGE: &str = include_str!("page.html");

/// The headers the page is sent with (besides its content type).
pub(super) const HEADERS: &[u8] = b"content-security-policy: default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'\r\nx-frame-options: DENY\r\nreferrer-policy: no-referrer\r\ncache-control: no-store\r\nx-content-type-options: nosniff\r\n";

pub(super) fn reply() -> Reply {
    Reply {
        status: 200,
        content_type: b"text/html; charset=utf-8",
        headers: HEADERS,
        body: PAGE.as_bytes().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn self_contained() {
        let p = super::PAGE;
        for external in ["http://", "https://", "src=", "<link", "@import", "url("] {
            assert!(!p.contains(external), "{external}");
        }
        assert!(p.contains("Authorization: \"Bearer \""));
        // the token is never written to storage, a cookie or a URL
        for leak in [
            "localStorage",
            "sessionStorage",
            "document.cookie",
            "?token",
            "innerHTML",
        ] {
            assert!(!p.contains(leak), "{leak}");
        }
    }
}
