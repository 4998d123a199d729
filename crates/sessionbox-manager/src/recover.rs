//! Finishing what an operation started when the store fails under it: the writes that remove
//! the record of a first open that failed, or of a destroyed conversation, are tried again
//! while the store is [`Error::Unavailable`] (a PostgreSQL restart, a full disk), first within
//! the request for up to [`FINISH_PATIENCE`], then in the background. A first open's record
//! either becomes a conversation or goes; a destroyed conversation's record goes once the store
//! takes it (until then it is `destroying`, which keeps every open away, and garbage collection
//! would finish it too).

use sessionbox_core::{ConversationKey, ConversationRef, Error, Result};
use sessionbox_store::Store;

use crate::Manager;

/// How long a record whose conversation is destroyed is tried to be deleted in the background
/// while the store stays unavailable (see `Manager::delete_later`).
pub(crate) const LATER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(600);

/// How long the store writes that finish what an operation started (removing the record of a
/// first open that failed, the record of a destroyed conversation) are tried again while the
/// store is [`Error::Unavailable`]: a PostgreSQL restart takes a second or two (and each call
/// already waits up to 3 s for a connection), and a record left behind would point at nothing.
pub(crate) const FINISH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

impl Manager {
    /// Remembers that the record of generation `generation` was made by a first open that
    /// failed and could not be removed (the store was unavailable), and retries its removal in
    /// the background, holding the conversation, until the store answers (for up to
    /// [`LATER_PATIENCE`]). Until then the next open of the key in this process removes it
    /// first ([`Manager::finish_pending_undo`]), so that open makes the conversation anew, with
    /// its starting state.
    pub(crate) fn undo_later(&self, key: &ConversationKey, generation: i64) {
        self.pending_undo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), generation);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (me, key) = (self.clone(), key.clone());
        rt.spawn(async move {
            let until = std::time::Instant::now() + LATER_PATIENCE;
            let mut pause = std::time::Duration::from_secs(1);
            while std::time::Instant::now() < until {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(10));
                let k = key.clone();
                let Ok(_held) = me.store.run(move |s| s.lock_conversation(&k)).await else {
                    continue;
                };
                match me.finish_pending_undo(&key).await {
                    Err(Error::Unavailable(_)) => continue,
                    _ => return,
                }
            }
        });
    }

    /// Removes the record of `key` that a failed first open left ([`Manager::undo_later`]),
    /// if there is one and it is still that open's: the same generation, active, and never
    /// used since it was made (a use from elsewhere, another replica that opened it meanwhile,
    /// made it a conversation, which stays). Call it holding the conversation.
    ///
    /// # Errors
    /// [`Error::Unavailable`] while the store still cannot take it (it stays pending).
    pub(crate) async fn finish_pending_undo(&self, key: &ConversationKey) -> Result<()> {
        let pending = self
            .pending_undo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied();
        let Some(generation) = pending else {
            return Ok(());
        };
        let k = key.clone();
        let record = self.store.run(move |s| s.get(&k)).await?;
        let unused = record.is_some_and(|r| {
            r.generation == generation
                && r.state == sessionbox_store::ConversationState::Active
                && r.last_used_at == r.created_at
        });
        if unused {
            let k = key.clone();
            if self
                .store
                .run(move |s| s.claim_for_destroy(&k, generation))
                .await?
            {
                if let Err(e) = self.runtime.destroy(key).await {
                    tracing::warn!(
                        "after a failed first open, the runtime could not clean up: {e}"
                    );
                }
                let k = key.clone();
                match self
                    .store
                    .run(move |s| s.delete_generation(&k, generation))
                    .await
                {
                    Err(Error::Unavailable(_)) => self.delete_later(key, generation, None),
                    Err(e) => {
                        tracing::warn!("cannot remove the record of a failed first open: {e}")
                    }
                    Ok(_) => {}
                }
            }
        }
        self.pending_undo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        Ok(())
    }

    /// Deletes the record of generation `generation`, already claimed `destroying` and whose
    /// runtime side is gone, in the background while the store stays unavailable (tried every
    /// few seconds for up to [`LATER_PATIENCE`]); then forgets `egress_of`'s own network policy
    /// and verdicts when given. The claim keeps every open away meanwhile; if this process ends
    /// first, garbage collection finishes the destroy (the record is `stuck`).
    pub(crate) fn delete_later(
        &self,
        key: &ConversationKey,
        generation: i64,
        egress_of: Option<ConversationRef>,
    ) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, key) = (self.store.clone(), key.clone());
        rt.spawn(async move {
            let until = std::time::Instant::now() + LATER_PATIENCE;
            let mut pause = std::time::Duration::from_secs(1);
            loop {
                let k = key.clone();
                match store.run(move |s| s.delete_generation(&k, generation)).await {
                    Err(Error::Unavailable(_)) if std::time::Instant::now() < until => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(std::time::Duration::from_secs(10));
                    }
                    Err(e) => {
                        tracing::warn!(key = %key.short(), error = %e, "cannot remove the record of a destroyed conversation; garbage collection will");
                        return;
                    }
                    Ok(removed) => {
                        if let (true, Some(c)) = (removed, egress_of) {
                            let _ = store
                                .run(move |s| s.forget_conversation_egress(&c).map(drop))
                                .await;
                        }
                        return;
                    }
                }
            }
        });
    }

    /// Runs the store call `f`, and again while the store is [`Error::Unavailable`], for up to
    /// [`FINISH_PATIENCE`]: for the writes that finish what an operation already did to the
    /// runtime (each is a conditional update, safe to repeat). The caller holds the
    /// conversation meanwhile.
    pub(crate) async fn finishing<T: Send + 'static>(
        &self,
        f: impl Fn(&Store) -> Result<T> + Clone + Send + 'static,
    ) -> Result<T> {
        let until = std::time::Instant::now() + FINISH_PATIENCE;
        let mut pause = std::time::Duration::from_millis(100);
        loop {
            match self.store.run(f.clone()).await {
                Err(Error::Unavailable(why)) if std::time::Instant::now() + pause < until => {
                    tracing::warn!("the store is unavailable, trying again: {why}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(1));
                }
                other => return other,
            }
        }
    }
}
