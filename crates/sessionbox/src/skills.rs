//! `sessionbox skills`: the tenant's skills, or one skill's SKILL.md body.

use std::process::ExitCode;

use sessionbox_core::Error;

use crate::App;

/// Lists the tenant's skills (name and description), or prints the body of the one `name`d.
/// A skill left out for breaking a rule is reported on stderr with the rule.
pub(crate) async fn run(app: &App, name: Option<String>) -> anyhow::Result<ExitCode> {
    let catalog = app.manager.skill_catalog(&app.tenant).await?;
    for k in &catalog.skipped {
        match crate::hint::skill_hint(&k.error) {
            Some(hint) => warn!("skill {} is left out: {}; {hint}", k.name(), k.error),
            None => warn!("skill {} is left out: {}", k.name(), k.error),
        }
    }
    match name {
        None => {
            for s in &catalog.skills {
                outln!("{}: {}", s.name(), s.doc.description);
            }
        }
        Some(n) => {
            let Some(s) = catalog.get(&n) else {
                return Err(Error::NotFound(format!(
                    "no skill named {n:?} in tenant {}",
                    app.tenant
                ))
                .into());
            };
            out!("{}", s.doc.body);
        }
    }
    Ok(ExitCode::SUCCESS)
}
