//! Conversation ids, tenant ids and conversation keys (`sessionbox_core::ids`): what a caller
//! names a conversation with, on every front end.
//!
//! Input: `TENANT \x1f ID` (or one string, tried as every kind).
//! Properties: an id is accepted exactly when it follows the documented rule (written again
//! here, independently); an accepted id is kept byte for byte (as_str, Display, FromStr, serde
//! both ways); an accepted id used as a path is one ordinary component, so it can never act as
//! a path; a key parses exactly when it is 64 lowercase hex digits; a derived key parses back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sessionbox_core::{ConversationId, ConversationKey, ConversationRef, TenantId, WorkspacePath};
use sessionbox_fuzz::text_fields;

/// The rule in the documentation: 1 to `max` characters; the first an ASCII letter or digit;
/// the rest ASCII letters, digits, `.`, `_` or `-`.
fn follows_rule(s: &str, max: usize) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && s.chars().count() <= max
}

macro_rules! check_id {
    ($ty:ty, $s:expr, $max:expr) => {{
        let s: &str = $s;
        let got = <$ty>::new(s);
        assert_eq!(
            got.is_ok(),
            follows_rule(s, $max),
            "{}::new({s:?}) = {got:?}",
            stringify!($ty)
        );
        let json = serde_json::to_string(s).expect("a string serialises");
        let via_serde: Result<$ty, _> = serde_json::from_str(&json);
        assert_eq!(
            via_serde.is_ok(),
            got.is_ok(),
            "serde and new disagree on {s:?}"
        );
        match got {
            Ok(id) => {
                assert_eq!(id.as_str(), s);
                assert_eq!(id.to_string(), s);
                assert_eq!(s.parse::<$ty>().expect("FromStr"), id);
                assert_eq!(via_serde.expect("checked"), id);
                assert_eq!(serde_json::to_string(&id).expect("serialise"), json);
                assert!(s.len() <= <$ty>::MAX_LEN);
                // Never a path: under any root it is one ordinary component.
                let p = WorkspacePath::resolve("/workspace", s).expect("an id is a valid path");
                assert_eq!(p.as_str(), s);
                assert_eq!(p.components().count(), 1);
                assert_eq!(String::from(id), s);
            }
            Err(e) => {
                assert_eq!(e.code(), "invalid_id");
                assert!(e.to_string().contains(<$ty>::RULE), "{e}");
            }
        }
    }};
}

fn check_key(s: &str) {
    let is_key = s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    match ConversationKey::parse(s) {
        Ok(k) => {
            assert!(is_key, "{s:?} parsed as a key");
            assert_eq!(k.as_str(), s);
            assert_eq!(k.short(), &s[..12]);
        }
        Err(e) => {
            assert!(!is_key, "{s:?} refused as a key: {e}");
            assert_eq!(e.code(), "invalid_id");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(f) = text_fields(data, 2) else {
        return;
    };
    let (tenant, id) = if data.contains(&sessionbox_fuzz::SEP) {
        (f[0], f[1])
    } else {
        ("default", f[0])
    };
    for s in [tenant, id] {
        check_id!(ConversationId, s, 128);
        check_id!(TenantId, s, 64);
        check_key(s);
    }
    if let Ok(r) = ConversationRef::parse(tenant, id) {
        assert_eq!(r.tenant.as_str(), tenant);
        assert_eq!(r.id.as_str(), id);
        assert_eq!(
            ConversationKey::parse(r.key.as_str()).expect("a derived key parses"),
            r.key
        );
        // Moving the boundary between tenant and id names another conversation.
        if id.len() > 1 {
            let other = format!("{tenant}{}", &id[..1]);
            if let Ok(o) = ConversationRef::parse(&other, &id[1..]) {
                assert_ne!(
                    o.key,
                    r.key,
                    "{tenant:?}/{id:?} and {other:?}/{:?}",
                    &id[1..]
                );
            }
        }
    }
});
