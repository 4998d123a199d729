//! Opening a conversation for one operation: [`Manager::open_for`] holds the conversation,
//! reads its record once, applies the open mode's rules to it (absent, expired) and opens it
//! from that record; [`Manager::revalidate`] tells a front end whether a session it kept is
//! still the conversation's.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sessionbox_core::{ConversationRef, Error, OpenMode, Result};
use sessionbox_store::{
    ConversationLock, ConversationRecord, ConversationState, ExpiredNotice, OrphanClaim,
};

use crate::snapshots::{DEFAULT_TEMPLATE, Start};
use crate::{Conversation, Manager};

/// How often [`Manager::revalidate`] renews a kept conversation's record at most: renewing on
/// every request of a busy conversation would write the store for nothing.
pub const TOUCH_EVERY: Duration = Duration::from_secs(1);

/// A value obtained while holding its conversation ([`Manager::hold`]): the conversation stays
/// held, across threads, processes and replicas, until this is dropped or taken apart.
#[must_use = "the conversation is held only while this lives"]
pub struct Held<T> {
    value: T,
    lock: ConversationLock,
}

impl<T> Held<T> {
    /// The value and the lock, to keep holding the conversation after the value is used up
    /// (a session closed), or to let it go earlier.
    pub fn into_parts(self) -> (T, ConversationLock) {
        (self.value, self.lock)
    }
}

impl<T> std::ops::Deref for Held<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::DerefMut for Held<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T> std::fmt::Debug for Held<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Held")
    }
}

/// `NotFound` for a conversation that does not exist, opened [`OpenMode::ExistingOnly`].
fn absent(conversation: &ConversationRef) -> Error {
    Error::NotFound(format!(
        "conversation {:?} does not exist",
        conversation.id.as_str()
    ))
}

/// `NotFound` for a conversation past its expiry, opened [`OpenMode::ExistingOnly`]: it is not
/// renewed nor destroyed (an operation that creates makes a new one, and says so).
fn expired(conversation: &ConversationRef, record: &ConversationRecord) -> Error {
    Error::NotFound(format!(
        "conversation {:?} expired at {} and its files are gone",
        conversation.id.as_str(),
        record
            .expires_at
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default()
    ))
}

impl Manager {
    /// Holds `conversation` for one operation (see [`sessionbox_store::Store::lock_conversation`]):
    /// one operation at a time per conversation, across processes and replicas. Not
    /// reentrant: open a held conversation with [`Manager::open_held`].
    ///
    /// # Errors
    /// [`Error::Backend`] when the lock cannot be taken.
    pub async fn hold(&self, conversation: &ConversationRef) -> Result<ConversationLock> {
        let key = conversation.key.clone();
        self.store.run(move |s| s.lock_conversation(&key)).await
    }

    /// Opens `conversation` for one operation: holds it ([`Manager::hold`]), reads its record
    /// once and opens it in `mode` from that record (see [`Manager::open_held`]).
    ///
    /// # Errors
    /// As [`Manager::open_held`], and [`Manager::hold`]'s.
    pub async fn open_for(
        &self,
        conversation: &ConversationRef,
        mode: OpenMode,
    ) -> Result<Held<Conversation>> {
        let lock = self.hold(conversation).await?;
        self.open_held(lock, conversation, mode).await
    }

    /// Opens `conversation`, already held by `lock`, in `mode`:
    ///
    /// | record | [`OpenMode::CreateIfAbsent`] | [`OpenMode::ExistingOnly`] |
    /// |---|---|---|
    /// | absent | made ([`Conversation::created`]) | [`Error::NotFound`], nothing made |
    /// | active | renewed and opened | renewed and opened |
    /// | expired | destroyed, made anew ([`Conversation::previous_expired`]) | [`Error::NotFound`] saying it expired; left to garbage collection |
    /// | destroying | [`Error::Busy`] | [`Error::Busy`] |
    ///
    /// The record is read once before the runtime opens (by `get_or_create_with` when the mode
    /// creates, which makes it in the same transaction when absent; else by a plain read, whose
    /// record the open uses as it is), and once after, to see that no destroy raced the open.
    ///
    /// # Errors
    /// As above, and as [`Manager::open`].
    pub async fn open_held(
        &self,
        lock: ConversationLock,
        conversation: &ConversationRef,
        mode: OpenMode,
    ) -> Result<Held<Conversation>> {
        let value = self.open_unheld(conversation, mode).await?;
        Ok(Held { value, lock })
    }

    /// [`Manager::open_held`] without holding the conversation: for an operation that changes
    /// nothing and may wait long (following a background command's output), which must not
    /// keep other operations of the conversation waiting.
    ///
    /// # Errors
    /// As [`Manager::open_held`].
    pub async fn open_unheld(
        &self,
        conversation: &ConversationRef,
        mode: OpenMode,
    ) -> Result<Conversation> {
        // What a failed first open of this key left, when the store could not take its removal.
        self.finish_pending_undo(&conversation.key).await?;
        let known = match mode {
            // Read (and made when absent) by `get_or_create_with`, in one transaction.
            OpenMode::CreateIfAbsent => None,
            OpenMode::ExistingOnly => {
                let key = conversation.key.clone();
                match self.store.run(move |s| s.get(&key)).await? {
                    None => return Err(absent(conversation)),
                    Some(r) if r.is_expired(self.store.now()) => {
                        return Err(expired(conversation, &r));
                    }
                    Some(r) => Some(Some(r)),
                }
            }
        };
        self.open_known(conversation, known, Start::DefaultTemplate)
            .await
    }

    /// Whether `conversation`, a session kept from an earlier open, may still be used: its
    /// record must still be the one it opened (same generation: not destroyed, here or
    /// elsewhere, and made again), active and unexpired, and the network policy in force must
    /// still have `policy_hash` (`None`: no policy stored). Renews the record at most once per
    /// [`TOUCH_EVERY`]; a renew that fails (it expired meanwhile) makes the answer `false`. On
    /// `false` the caller closes the session and opens the conversation afresh. Call it with
    /// the conversation held.
    ///
    /// # Errors
    /// [`Error::Backend`] when the store fails.
    pub async fn revalidate(
        &self,
        conversation: &Conversation,
        policy_hash: Option<&str>,
    ) -> Result<bool> {
        let conv = conversation.conversation().clone();
        let generation = conversation.record().generation;
        let policy = policy_hash.map(str::to_owned);
        let touch = conversation.touched_at().elapsed() >= TOUCH_EVERY;
        let valid = self
            .store
            .run(move |s| {
                let now = s.now();
                let valid = s.get(&conv.key)?.is_some_and(|r| {
                    r.generation == generation
                        && r.state == ConversationState::Active
                        && !r.is_expired(now)
                }) && s.effective_egress_policy(&conv)?.map(|p| p.hash) == policy;
                if valid && touch {
                    return Ok(s.touch(&conv.key, now).is_ok());
                }
                Ok(valid)
            })
            .await?;
        if valid && touch {
            conversation.touched_now();
        }
        Ok(valid)
    }

    /// Opens `conversation`, creating its record and workspace on first use, and renews it.
    ///
    /// An expired conversation is destroyed first and made again (as a new conversation: its
    /// files are gone).
    ///
    /// # Errors
    /// - [`Error::Conflict`] when the conversation belongs to another runtime.
    /// - [`Error::Busy`] while it is being destroyed or cleaned up (retry).
    /// - [`Error::NotFound`] when it was destroyed while this call opened it.
    /// - The runtime's errors.
    pub async fn open(&self, conversation: &ConversationRef) -> Result<Conversation> {
        self.finish_pending_undo(&conversation.key).await?;
        self.open_known(conversation, None, Start::DefaultTemplate)
            .await
    }

    /// [`Manager::open`], starting from the record the caller read (`Some`), or reading it
    /// (`None`). Audits the open, gives a conversation it creates its starting state (`start`:
    /// the tenant's default template is cloned or restored; a fork's clone is made here, its
    /// archive by the caller) and delivers skills.
    pub(crate) async fn open_known(
        &self,
        conversation: &ConversationRef,
        known: Option<Option<ConversationRecord>>,
        start: Start<'_>,
    ) -> Result<Conversation> {
        let template = matches!(start, Start::DefaultTemplate);
        let result = self.open_inner(conversation, known, start).await;
        match &result {
            Ok((conv, created)) => {
                let detail = match (created, conv.session.state_lost()) {
                    (true, _) => Some(match &conv.previous_expired {
                        Some(n) => format!(
                            "created previous_expired_at={}",
                            n.expired_at
                                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                        ),
                        None => "created".to_owned(),
                    }),
                    // The sandbox had vanished and was replaced: its files are gone.
                    (false, true) => Some("state_lost".to_owned()),
                    (false, false) => None,
                };
                self.audit(conversation, "open", &Ok::<(), Error>(()), detail)
                    .await;
            }
            Err(e) => {
                self.audit(conversation, "open", &Err::<(), _>(e.clone()), None)
                    .await;
            }
        }
        let (conv, created) = result?;
        if created {
            self.refill_after_create(&conversation.tenant);
        }
        if created && template {
            let r = match &conv.cloned {
                Some((stats, from)) => Ok(Some(format!(
                    "template={DEFAULT_TEMPLATE} {from} files={} bytes={} clone",
                    stats.files, stats.bytes
                ))),
                None => {
                    self.apply_default_template(conversation, &*conv.session)
                        .await
                }
            };
            if !matches!(r, Ok(None)) {
                self.audit(
                    conversation,
                    "template",
                    &r,
                    r.as_ref().ok().cloned().flatten(),
                )
                .await;
            }
            if let Err(e) = r {
                // Made without its starting state: undone, so the next open tries again.
                let generation = conv.record.generation;
                let _ = sessionbox_core::Session::close(Box::new(conv)).await;
                self.undo_create(&conversation.key, generation).await;
                return Err(e);
            }
        }
        if !self.skills.roots(&conversation.tenant).is_empty() {
            let r = self.deliver_skills(conversation, &*conv.session).await;
            self.audit(conversation, "skills", &r, r.as_ref().ok().cloned())
                .await;
            r?;
        }
        Ok(conv)
    }

    async fn open_inner(
        &self,
        conversation: &ConversationRef,
        mut known: Option<Option<ConversationRecord>>,
        start: Start<'_>,
    ) -> Result<(Conversation, bool)> {
        let runtime_name = self.runtime.info().name;
        let lifecycle = self.lifecycle.for_tenant(&conversation.tenant);
        let mut expired_once = false;
        let mut expired_here = None;
        let (record, created) = loop {
            let (record, created) = match known.take() {
                // Read by the caller under the conversation's lock: used as
                // `get_or_create_with` would return it, without reading it again.
                Some(Some(record)) => {
                    record.check_runtime(&runtime_name)?;
                    (record, false)
                }
                // Absent (or not read): made here, insert-if-absent.
                Some(None) | None => {
                    let conv = conversation.clone();
                    let name = runtime_name.clone();
                    self.store
                        .run(move |s| s.get_or_create_with(&conv, &name, s.now(), &lifecycle))
                        .await?
                }
            };
            if record.state == ConversationState::Destroying {
                return Err(Error::Busy(format!(
                    "conversation {} is being destroyed; retry in a moment",
                    conversation.id
                )));
            }
            if !record.is_expired(self.store.now()) {
                break (record, created);
            }
            if expired_once {
                return Err(Error::Busy(format!(
                    "conversation {} expired and is being destroyed; retry in a moment",
                    conversation.id
                )));
            }
            expired_once = true;
            self.destroy_expired(conversation, &record).await?;
            expired_here = Some(record);
        };
        // A new record of a key whose last conversation expired: the caller is told, never
        // handed a silently empty workspace. The notice is the store's (it outlives garbage
        // collection); this open destroyed it itself when the notice is missing. It is looked
        // for with a plain read, and taken (a transaction: one racing taker gets it) only when
        // there is one: a notice is written before its record is deleted, so none can appear
        // once this record exists.
        //
        // Then the hash of the policy in force as the runtime opens (read before it does: a
        // change after this makes a front end that keeps the session reopen it, never keeps a
        // session opened under another policy); an existing record is renewed. All in one trip
        // off the async runtime.
        let (key, conv) = (conversation.key.clone(), conversation.clone());
        let read = self
            .store
            .run(move |s| {
                let taken = match created {
                    true if s.expired_notice(&key)?.is_some() => s.take_expired_notice(&key)?,
                    true => None,
                    false => {
                        s.touch(&key, s.now())?;
                        None
                    }
                };
                let policy_hash = s.effective_egress_policy(&conv)?.map(|p| p.hash);
                Ok((taken, policy_hash))
            })
            .await;
        let (taken, policy_hash) = match read {
            Ok(read) => read,
            Err(e) => {
                // A record this open made, then could not go on with (the store failed): it
                // goes, or it would stay without its workspace and its starting state.
                if created {
                    self.undo_create(&conversation.key, record.generation).await;
                }
                return Err(e);
            }
        };
        let previous_expired = if created {
            taken.or_else(|| {
                expired_here.map(|r| ExpiredNotice {
                    key: r.key.clone(),
                    tenant: r.tenant.clone(),
                    conversation_id: r.conversation_id.clone(),
                    expired_at: r.expires_at.unwrap_or_else(|| self.store.now()),
                    destroyed_at: self.store.now(),
                })
            })
        } else {
            None
        };
        // A new conversation's starting state, where the runtime clones it: made before the
        // runtime first opens it, and undone with it.
        let cloned = match created {
            true => match self.clone_start(conversation, &start).await {
                Ok(c) => c,
                Err(e) => {
                    self.undo_create(&conversation.key, record.generation).await;
                    return Err(e);
                }
            },
            false => None,
        };
        let session = match self.runtime.open(conversation).await {
            Ok(s) => s,
            Err(e) => {
                if created {
                    // Its first open failed, so the conversation never came to be: the record
                    // goes, and the id stays free for any runtime (a wrong endpoint or key
                    // leaves nothing behind).
                    self.undo_create(&conversation.key, record.generation).await;
                }
                return Err(e);
            }
        };
        // The record may have been destroyed while the runtime opened the conversation (a
        // renew racing expiry, a destroy from another process): then what the runtime just
        // made may have no owner.
        let key = conversation.key.clone();
        let now = match self.store.run(move |s| s.get(&key)).await {
            Ok(now) => now,
            Err(e) => {
                // Opened, but whether its record still stands is unknown (the store failed): a
                // conversation this open made is undone (it would otherwise miss its starting
                // state); an existing one is left as it is.
                let _ = session.close().await;
                if created {
                    self.undo_create(&conversation.key, record.generation).await;
                }
                return Err(e);
            }
        };
        match now {
            Some(r)
                if r.generation == record.generation && r.state == ConversationState::Active =>
            {
                Ok((
                    Conversation {
                        session,
                        conversation: conversation.clone(),
                        record,
                        created,
                        previous_expired,
                        policy_hash,
                        store: self.store.clone(),
                        touched: Mutex::new(Instant::now()),
                        cloned,
                    },
                    created,
                ))
            }
            now => {
                let _ = session.close().await;
                let ours = match &now {
                    // Being destroyed: whoever destroys it may have finished with the runtime
                    // before this open made a sandbox again.
                    Some(r) => r.generation == record.generation,
                    // Gone: remove what this open made, unless a new record claims the key.
                    None => {
                        let key = conversation.key.clone();
                        self.store
                            .run(move |s| s.claim_orphan(&key, s.now()))
                            .await?
                            == OrphanClaim::Claimed
                    }
                };
                if ours {
                    let removed = self.runtime.destroy(&conversation.key).await;
                    if now.is_none() {
                        let key = conversation.key.clone();
                        self.store.run(move |s| s.release_orphan(&key)).await?;
                    }
                    removed?;
                }
                Err(Error::NotFound(format!(
                    "conversation {} was destroyed while it was being opened",
                    conversation.id
                )))
            }
        }
    }
}
