//! A fork's network policy: a fork stays as restrained as its origin.

use sessionbox_core::{ConversationRef, Result};
use sessionbox_store::PolicyScope;

use crate::Manager;

impl Manager {
    /// Gives `to` the network policy `from` has of its own, if it has one and `to` has none;
    /// true when it did.
    pub(super) async fn carry_policy(
        &self,
        from: &ConversationRef,
        to: &ConversationRef,
    ) -> Result<bool> {
        let (from, to) = (from.clone(), to.clone());
        self.store
            .run(move |s| {
                let Some(own) = s.egress_policy(&PolicyScope::Conversation(from))? else {
                    return Ok(false);
                };
                let target = PolicyScope::Conversation(to);
                if s.egress_policy(&target)?.is_some() {
                    return Ok(false);
                }
                s.set_egress_policy(&target, &own.policy, &own.hash, s.now())?;
                Ok(true)
            })
            .await
    }
}
