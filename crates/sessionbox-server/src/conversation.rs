//! Opening a conversation for one request, and giving it back.
//!
//! One request on a conversation runs this sequence: wait for the conversation's turn in this
//! server (fair, bounded: 429 past [`ServerConfig::max_queue`](crate::ServerConfig)), hold it
//! across processes and replicas (the store's conversation lock), take the session kept from an
//! earlier request while its record is still the one it opened (else open it through the
//! [`Manager`](sessionbox_manager::Manager)), run the operation, then keep the session for the
//! next request and end the turn.
//!
//! [`AppState::with_conversation`] is the whole sequence around one closure, and the way
//! handlers use it: the session always goes back to the cache. Only a response that outlives
//! its handler (an event stream) takes an [`Opened`] from [`AppState::open`] and ends it itself
//! with [`Opened::finish`] or [`Opened::detach`].
//!
//! Errors are [`sessionbox_core::Error`]s; the front ends map them (HTTP: [`crate::ApiError`];
//! MCP: a tool error).

use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderValue;
use axum::response::Response;
use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationKey, ConversationRef, Error, Result};
use sessionbox_manager::Conversation;
use sessionbox_store::{ConversationLock, ConversationRecord, ConversationState, Store};

use crate::queue::Turn;
use crate::sessions::{self, Cached, Sessions};
use crate::{AppState, blocking};

/// Whether a request may create the conversation it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpenMode {
    /// Create it (workspace and sandbox) when it does not exist.
    CreateIfAbsent,
    /// A conversation that does not exist, or expired, is `not_found`; nothing is created.
    ExistingOnly,
}

impl OpenMode {
    /// The mode of an operation: only the operations that create a conversation may.
    pub(crate) fn creating(creates: bool) -> Self {
        if creates {
            OpenMode::CreateIfAbsent
        } else {
            OpenMode::ExistingOnly
        }
    }
}

/// The operations, by their audit name, that create the conversation they name: open, exec,
/// write, upload and mkdir over REST, `bash` and `write` over MCP. Every other one answers
/// `not_found` for a conversation that does not exist.
pub(crate) fn creates(operation: &str) -> bool {
    matches!(
        operation,
        "open" | "exec" | "write" | "upload" | "mkdir" | "bash"
    )
}

/// An open conversation and the turn that orders it. End it with [`Opened::finish`] (or
/// [`Opened::detach`]); dropping it closes the session instead of keeping it.
pub(crate) struct Opened {
    /// The session.
    pub(crate) conv: Conversation,
    /// True when this request created the conversation.
    created: bool,
    /// When this request created it because the last one of its id expired: when that one
    /// expired.
    previous_expired_at: Option<DateTime<Utc>>,
    touched: Instant,
    sessions: Arc<Sessions>,
    /// The conversation held across processes and replicas (see `AppState::hold`).
    _held: ConversationLock,
    /// The session cache's generation before this session was opened or taken.
    generation: u64,
    /// The hash of the network policy in force when the session was opened (`None`: the
    /// profile `none`).
    policy: Option<String>,
    _turn: Turn,
}

/// What the work of [`AppState::with_conversation`] gets: the open session and how it was
/// opened. (Not the [`Opened`] itself, which holds the cross-process lock and is not `Sync`.)
#[derive(Clone, Copy)]
pub(crate) struct InUse<'a> {
    /// The session.
    pub(crate) conv: &'a Conversation,
    created: bool,
    previous_expired_at: Option<DateTime<Utc>>,
}

impl InUse<'_> {
    /// True when this request created the conversation.
    pub(crate) fn created(&self) -> bool {
        self.created
    }

    /// When this request made the conversation anew because the last one of its id expired:
    /// when that one expired (its files are gone). See [`notify_expired`].
    pub(crate) fn previous_expired_at(&self) -> Option<DateTime<Utc>> {
        self.previous_expired_at
    }
}

impl Opened {
    /// When this request made the conversation anew because the last one of its id expired:
    /// when that one expired (its files are gone). See [`notify_expired`].
    pub(crate) fn previous_expired_at(&self) -> Option<DateTime<Utc>> {
        self.previous_expired_at
    }

    /// The session alone: the turn and the cross-process hold end here, so a long wait on the
    /// session (following a background command) does not hold up the conversation's other
    /// requests. The caller closes the session.
    pub(crate) fn detach(self) -> Conversation {
        self.conv
    }

    /// Keeps the session for the conversation's next request (closing one that the cache lets
    /// go), then ends the turn.
    pub(crate) async fn finish(self) {
        let Opened {
            conv,
            touched,
            sessions,
            _held,
            generation,
            policy,
            _turn,
            ..
        } = self;
        let key = conv.conversation().key.clone();
        let cached = Cached {
            conv,
            used: Instant::now(),
            touched,
            policy,
        };
        sessions::close_all(sessions.put(key, cached, generation)).await;
    }
}

/// The hash of the network policy in force for `conv` (`None`: the profile `none`). A kept
/// session is used only while this is what it was opened under: a policy changed through
/// another replica, or with the CLI, reaches the runtime on the next request (the `isolated`
/// runtime relaunches a sandbox switched between `none` and an allowlist).
fn policy_hash(store: &Store, conv: &ConversationRef) -> Result<Option<String>> {
    Ok(store
        .effective_egress_policy(conv)?
        .map(|policy| policy.hash))
}

impl AppState {
    /// Runs `work` on conversation `conv`, opened as `mode` says, in its turn; then keeps the
    /// session for the next request and ends the turn, whatever `work` answered.
    ///
    /// # Errors
    /// Opening's: `busy` (the queue is full), `not_found` (with [`OpenMode::ExistingOnly`]),
    /// the store's and the runtime's. `work`'s own result is `Ok`'s value.
    pub(crate) async fn with_conversation<T>(
        &self,
        conv: &ConversationRef,
        mode: OpenMode,
        work: impl AsyncFnOnce(InUse<'_>) -> T,
    ) -> Result<T> {
        let opened = self.open(conv, mode).await?;
        let result = work(InUse {
            conv: &opened.conv,
            created: opened.created,
            previous_expired_at: opened.previous_expired_at,
        })
        .await;
        opened.finish().await;
        Ok(result)
    }

    /// This server's turn on `key`: one request at a time per conversation, in arrival order.
    pub(crate) async fn turn(&self, key: &ConversationKey) -> Result<Turn> {
        self.queues
            .turn(key, self.config.max_queue)
            .await
            .ok_or_else(|| {
                Error::Busy(format!(
                    "more than {} requests are queued for this conversation; retry later",
                    self.config.max_queue
                ))
            })
    }

    /// Holds the conversation for one operation across processes and replicas sharing the
    /// store (after this server's own turn, which orders its requests fairly). With
    /// PostgreSQL this is an advisory lock: requests on one conversation at two replicas run one
    /// at a time.
    pub(crate) async fn hold(&self, key: &ConversationKey) -> Result<ConversationLock> {
        let store = self.manager.store().clone();
        let key = key.clone();
        blocking(move || store.lock_conversation(&key)).await
    }

    /// Whether a cached session may still be used: its record must still be the one it opened
    /// (same generation: not destroyed, here or by another replica, and made again), active and
    /// unexpired. Renews the record at most once per `TOUCH_EVERY`. On `false` the session is
    /// closed and the conversation opened afresh.
    async fn still_valid(&self, cached: &Cached) -> Result<Option<Instant>> {
        let store = self.manager.store().clone();
        let conv = cached.conv.conversation().clone();
        let key = conv.key.clone();
        let generation = cached.conv.record().generation;
        let policy = cached.policy.clone();
        let touch = cached.touched.elapsed() >= sessions::TOUCH_EVERY;
        let valid = blocking(move || {
            let now = Utc::now();
            let valid = store.get(&key)?.is_some_and(|record| {
                record.generation == generation
                    && record.state == ConversationState::Active
                    && !record.is_expired(now)
            }) && policy_hash(&store, &conv)? == policy;
            if valid && touch {
                return Ok(store.touch(&key, now).is_ok());
            }
            Ok(valid)
        })
        .await?;
        Ok(valid.then(|| {
            if touch {
                Instant::now()
            } else {
                cached.touched
            }
        }))
    }

    /// The stored record of `key`, if any.
    pub(crate) async fn record(&self, key: &ConversationKey) -> Result<Option<ConversationRecord>> {
        let store = self.manager.store().clone();
        let key = key.clone();
        blocking(move || store.get(&key)).await
    }

    /// Waits for the conversation's turn, then opens it. With [`OpenMode::ExistingOnly`], a
    /// conversation that does not exist is `not_found` and is not created. Prefer
    /// [`AppState::with_conversation`]; the caller must end what this returns.
    pub(crate) async fn open(&self, conv: &ConversationRef, mode: OpenMode) -> Result<Opened> {
        let turn = self.turn(&conv.key).await?;
        let held = self.hold(&conv.key).await?;
        let generation = self.sessions.generation();
        if let Some(cached) = self.sessions.take(&conv.key) {
            // Kept from an earlier request: used only while its record is still the one it
            // opened (another process or replica may have destroyed it, or it expired).
            match self.still_valid(&cached).await {
                Ok(Some(touched)) => {
                    return Ok(Opened {
                        conv: cached.conv,
                        created: false,
                        previous_expired_at: None,
                        touched,
                        sessions: self.sessions.clone(),
                        _held: held,
                        generation,
                        policy: cached.policy.clone(),
                        _turn: turn,
                    });
                }
                Ok(None) => sessions::close_all(vec![cached.conv]).await,
                Err(error) => {
                    sessions::close_all(vec![cached.conv]).await;
                    return Err(error);
                }
            }
        }
        if mode == OpenMode::ExistingOnly {
            match self.record(&conv.key).await? {
                None => return Err(conversation_not_found(conv)),
                Some(record) if record.is_expired(Utc::now()) => {
                    return Err(conversation_expired(conv, &record));
                }
                Some(_) => {}
            }
        }
        // Read before the runtime opens it: a change after this makes the next request
        // reopen, never keeps a session opened under another policy.
        let (store, conv_ref) = (self.manager.store().clone(), conv.clone());
        let policy = blocking(move || policy_hash(&store, &conv_ref)).await?;
        let opened = self.manager.open(conv).await?;
        Ok(Opened {
            created: opened.created(),
            previous_expired_at: opened.previous_expired().map(|n| n.expired_at),
            conv: opened,
            touched: Instant::now(),
            sessions: self.sessions.clone(),
            _held: held,
            generation,
            policy,
            _turn: turn,
        })
    }
}

/// The response header that tells a caller its request made the conversation anew because the
/// last one of its id expired (its files are gone): when that one expired, in RFC 3339.
pub(crate) const PREVIOUS_EXPIRED_HEADER: &str = "sessionbox-previous-expired-at";

/// Adds [`PREVIOUS_EXPIRED_HEADER`] to `response` when `at` is some.
pub(crate) fn notify_expired(mut response: Response, at: Option<DateTime<Utc>>) -> Response {
    if let Some(at) = at
        && let Ok(value) =
            HeaderValue::from_str(&at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    {
        response
            .headers_mut()
            .insert(PREVIOUS_EXPIRED_HEADER, value);
    }
    response
}

/// `not_found` for a conversation that does not exist.
pub(crate) fn conversation_not_found(conv: &ConversationRef) -> Error {
    Error::NotFound(format!(
        "conversation {:?} does not exist",
        conv.id.as_str()
    ))
}

/// `not_found` for a conversation past its expiry, read by a request that does not create.
fn conversation_expired(conv: &ConversationRef, record: &ConversationRecord) -> Error {
    Error::NotFound(format!(
        "conversation {:?} expired at {} and its files are gone; exec, write, mkdir or \
         POST /v1/conversations/{{id}} make a new one",
        conv.id.as_str(),
        record
            .expires_at
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default()
    ))
}
