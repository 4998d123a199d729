//! Bytes as base64 text (standard alphabet, padded) in JSON, for serde's `with`: one helper for
//! every sessionbox extension that carries bytes (stdin, output events, file contents,
//! background command output).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer, Serializer};

/// `Vec<u8>` as a base64 string.
pub(crate) mod bytes {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(data))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

/// `Option<Vec<u8>>` as an optional base64 string.
pub(crate) mod optional {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        data: &Option<Vec<u8>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match data {
            Some(d) => s.serialize_str(&STANDARD.encode(d)),
            None => s.serialize_none(),
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<u8>>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(t) => STANDARD
                .decode(t)
                .map(Some)
                .map_err(serde::de::Error::custom),
            None => Ok(None),
        }
    }
}
