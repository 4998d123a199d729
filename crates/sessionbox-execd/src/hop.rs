//! Hop-by-hop headers (RFC 9110 §7.6.1), which describe one connection and are never passed
//! on by a relay: the agent's `/proxy` and a front end's relay to the agent share these rules.

use http::{HeaderMap, HeaderName, HeaderValue, header};

/// Hop-by-hop headers a relay always drops, besides those `Connection` names and `Upgrade`.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// The `Upgrade` value when `headers` ask for a protocol upgrade (`Connection: upgrade` and an
/// `Upgrade` header, as a WebSocket handshake does).
pub fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// Removes hop-by-hop headers, those `Connection` names included, and `Upgrade`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::try_from(t.trim()).ok())
        .collect();
    for h in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(h);
    }
    headers.remove(header::UPGRADE);
}

/// Puts an upgrade (`value`, from [`upgrade_of`]) back on headers that
/// [`strip_hop_by_hop`] cleaned: `Connection: upgrade` and `Upgrade: value`.
pub fn set_upgrade(headers: &mut HeaderMap, value: HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_websocket_handshake_is_an_upgrade_and_its_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade, x-private"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        assert_eq!(upgrade_of(&h).unwrap(), "websocket");
        strip_hop_by_hop(&mut h);
        assert!(h.get("x-private").is_none() && h.get(header::UPGRADE).is_none());
        assert!(h.get(header::CONNECTION).is_none() && h.get(header::TE).is_none());
        assert_eq!(h.len(), 1, "only x-kept is left: {h:?}");
        set_upgrade(&mut h, HeaderValue::from_static("websocket"));
        assert_eq!(upgrade_of(&h).unwrap(), "websocket");
    }

    #[test]
    fn upgrade_without_connection_upgrade_is_not_one() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert!(upgrade_of(&h).is_none());
    }
}
