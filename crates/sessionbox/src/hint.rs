//! What to do next, in this command line's words: the library crates' errors say what went
//! wrong in neutral terms (a runtime, an endpoint, a setting); [`hint`] adds the flag, the
//! environment variable or the `sessionbox.toml` section that fixes it, so the printed error
//! still tells a CLI user what to type.

use sessionbox::config::RuntimeKind;
use sessionbox_core::Error;
use sessionbox_skills::SkillError;

/// The advice for `e`, the error a command ended with, when this command line has some.
/// `runtime` is the runtime given with `--runtime` (or SESSIONBOX_RUNTIME), if any.
pub(crate) fn hint(e: &anyhow::Error, runtime: Option<RuntimeKind>) -> Option<String> {
    let error = e.downcast_ref::<Error>()?;
    match error {
        Error::RuntimeUnavailable {
            runtime: name,
            reason,
            ..
        } if name == RuntimeKind::Opensandbox.name() => {
            Some(if reason.contains("network policy") {
                "or set network_policy = false in [opensandbox] of sessionbox.toml".to_owned()
            } else {
                "scripts/opensandbox-up starts a local server; give its address with --endpoint \
             http://HOST:PORT, OPEN_SANDBOX_DOMAIN or endpoint in [opensandbox] of \
             sessionbox.toml"
                    .to_owned()
            })
        }
        Error::RuntimeUnavailable { runtime: name, .. } if name == RuntimeKind::Aio.name() => Some(
            "give the server with --endpoint URL, AIO_SANDBOX_BASE_URL or endpoint in [aio] \
                 of sessionbox.toml"
                .to_owned(),
        ),
        Error::Conflict(message) => {
            // "conversation X belongs to the R runtime; ...": pass that runtime.
            let owner = message
                .split_once("belongs to the ")?
                .1
                .split_once(" runtime")?
                .0;
            let owner = <RuntimeKind as clap::ValueEnum>::from_str(owner, false).ok()?;
            (Some(owner) != runtime).then(|| {
                format!(
                    "pass --runtime {} (or unset SESSIONBOX_RUNTIME, which counts as choosing one)",
                    owner.name()
                )
            })
        }
        Error::InvalidRequest(message) if message.contains("while no API key exists") => {
            Some("run `sessionbox keys create --tenant TENANT`".to_owned())
        }
        _ => None,
    }
}

/// The advice for a skill left out for `e`, when this command line has some.
pub(crate) fn skill_hint(e: &SkillError) -> Option<&'static str> {
    match e {
        SkillError::TooLarge { .. } => Some("[skills] in sessionbox.toml sets the limits"),
        _ => None,
    }
}
