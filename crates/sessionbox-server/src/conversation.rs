//! Opening a conversation for one request, and giving it back.
//!
//! One request on a conversation runs this sequence: wait for the conversation's turn in this
//! server (fair, bounded: 429 past [`ServerConfig::max_queue`](crate::ServerConfig)), hold it
//! across processes and replicas ([`Manager::hold`]), take the session kept from an earlier
//! request while [`Manager::revalidate`] says it is still the conversation's (else open it with
//! [`Manager::open_held`], in the mode of the request's [`Operation`]), run the operation, then
//! keep the session for the next request and end the turn. The rules (which record is still
//! valid, when it is renewed, what an absent or expired conversation answers) are the
//! manager's; this module adds only the turn and the cache.
//!
//! [`AppState::with_conversation`] is the whole sequence around one closure, and the way
//! handlers use it: the session always goes back to the cache. A foreground command's session
//! is published while it runs, and a read-only operation of the same conversation runs on it
//! at once instead of waiting for its turn (`running.rs`). Only a response that outlives
//! its handler (an event stream) takes an [`Opened`] from [`AppState::open`] and ends it itself
//! with [`Opened::finish`] or [`Opened::detach`].
//!
//! Errors are [`sessionbox_core::Error`]s; the front ends map them (HTTP: [`crate::ApiError`];
//! MCP: a tool error).
//!
//! [`Manager::hold`]: sessionbox_manager::Manager::hold
//! [`Manager::revalidate`]: sessionbox_manager::Manager::revalidate
//! [`Manager::open_held`]: sessionbox_manager::Manager::open_held

use std::sync::Arc;
use std::time::Instant;

use axum::http::HeaderValue;
use axum::response::Response;
use chrono::{DateTime, Utc};
use sessionbox_core::{ConversationKey, ConversationRef, Error, OpenMode, Operation, Result};
use sessionbox_manager::Conversation;
use sessionbox_store::ConversationLock;

use crate::AppState;
use crate::queue::Turn;
use crate::running::{self, Order, Published};
use crate::sessions::{self, Cached, Sessions};

/// An open conversation and the turn that orders it. End it with [`Opened::finish`] (or
/// [`Opened::detach`]); dropping it closes the session instead of keeping it.
pub(crate) struct Opened {
    /// Withdraws the session from reads beside it (a foreground command's) when dropped;
    /// declared first so that it is withdrawn first.
    published: Option<Published>,
    /// The session (shared only with the reads beside a foreground command).
    pub(crate) conv: Arc<Conversation>,
    /// True when this request created the conversation.
    created: bool,
    sessions: Arc<Sessions>,
    /// The session cache's generation before this session was opened or taken.
    generation: u64,
    /// The conversation held across processes and replicas
    /// ([`sessionbox_manager::Manager::hold`]) and the turn, shared with the reads beside a
    /// foreground command: released when this and they have all ended.
    _order: Order,
}

/// What the work of [`AppState::with_conversation`] gets: the open session and how it was
/// opened. (Not the [`Opened`] itself, which holds the cross-process lock and is not `Sync`.)
#[derive(Clone, Copy)]
pub(crate) struct InUse<'a> {
    /// The session.
    pub(crate) conv: &'a Conversation,
    created: bool,
}

impl InUse<'_> {
    /// True when this request created the conversation.
    pub(crate) fn created(&self) -> bool {
        self.created
    }

    /// When this request made the conversation anew because the last one of its id expired:
    /// when that one expired (its files are gone). See [`notify_expired`].
    pub(crate) fn previous_expired_at(&self) -> Option<DateTime<Utc>> {
        previous_expired_at(self.conv, self.created)
    }
}

/// When `conv`, opened by this request (`created`: it made it), replaced one of its id that
/// had expired: when that one expired. A session taken from the cache replaced nothing.
fn previous_expired_at(conv: &Conversation, created: bool) -> Option<DateTime<Utc>> {
    created
        .then(|| conv.previous_expired().map(|notice| notice.expired_at))
        .flatten()
}

impl Opened {
    /// When this request made the conversation anew because the last one of its id expired:
    /// when that one expired (its files are gone). See [`notify_expired`].
    pub(crate) fn previous_expired_at(&self) -> Option<DateTime<Utc>> {
        previous_expired_at(&self.conv, self.created)
    }

    /// The session, withdrawn from reads beside it once those running have ended, and the
    /// turn and hold (released when the caller drops them).
    async fn take(self) -> (Conversation, Order) {
        let Opened {
            published,
            conv,
            _order,
            ..
        } = self;
        if let Some(published) = published {
            published.end().await;
        }
        (running::exclusive(conv).await, _order)
    }

    /// The session alone: the turn and the cross-process hold end here, so a long wait on the
    /// session (following a background command) does not hold up the conversation's other
    /// requests. The caller closes the session.
    pub(crate) async fn detach(self) -> Conversation {
        self.take().await.0
    }

    /// Keeps the session for the conversation's next request (closing one that the cache lets
    /// go), then ends the turn.
    pub(crate) async fn finish(self) {
        let sessions = self.sessions.clone();
        let generation = self.generation;
        let (conv, _order) = self.take().await;
        let key = conv.conversation().key.clone();
        let cached = Cached {
            conv,
            used: Instant::now(),
        };
        sessions::close_all(sessions.put(key, cached, generation)).await;
    }
}

impl AppState {
    /// Runs `work` on conversation `conv`, opened for `operation` (in the mode
    /// [`Operation::open_mode`] gives), in its turn; then keeps the session for the next
    /// request and ends the turn, whatever `work` answered.
    ///
    /// # Errors
    /// Opening's: `busy` (the queue is full), `not_found` (an operation that does not create,
    /// on a conversation that does not exist or expired), the store's and the runtime's.
    /// `work`'s own result is `Ok`'s value.
    pub(crate) async fn with_conversation<T>(
        &self,
        conv: &ConversationRef,
        operation: Operation,
        work: impl AsyncFnOnce(InUse<'_>) -> T,
    ) -> Result<T> {
        let opened = if operation.beside_commands() {
            match self.open_or_share(conv, operation).await? {
                Ok(opened) => opened,
                Err(reader) => {
                    // Beside the conversation's running command, on its session, under its
                    // turn.
                    return Ok(work(InUse {
                        conv: &reader.conv,
                        created: false,
                    })
                    .await);
                }
            }
        } else {
            self.open(conv, operation).await?
        };
        let result = work(InUse {
            conv: &opened.conv,
            created: opened.created,
        })
        .await;
        opened.finish().await;
        Ok(result)
    }

    /// For a read-only operation: the session of the conversation's running foreground
    /// command when there is one (`Err`, the reader), else the conversation opened in its
    /// turn. A command that takes the turn while the read waits for it and publishes its
    /// session ends the wait: the read runs beside it instead of after it.
    async fn open_or_share(
        &self,
        conv: &ConversationRef,
        operation: Operation,
    ) -> Result<std::result::Result<Opened, running::Reader>> {
        // One wait for the turn, kept across publications: only a read that runs beside a
        // command gives its place in the queue up. Nothing but the wait is raced.
        let turn = self.turn(&conv.key);
        tokio::pin!(turn);
        loop {
            let publication = self.running.next_publication();
            tokio::pin!(publication);
            publication.as_mut().enable();
            if let Some(reader) = self.running.reader(&conv.key)? {
                return Ok(Err(reader));
            }
            tokio::select! {
                turn = &mut turn => return self.open_in_turn(turn?, conv, operation).await.map(Ok),
                // Some conversation's command published its session: look again.
                () = &mut publication => {}
            }
        }
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

    /// Waits for the conversation's turn, holds it, then takes its kept session if the
    /// manager still vouches for it, else opens it for `operation`. An operation that does not
    /// create finds a conversation that does not exist (or expired) `not_found`, and nothing is
    /// created. A foreground command's session ([`Operation::Exec`]) is published for reads
    /// beside it until it ends. Prefer [`AppState::with_conversation`]; the caller must end what
    /// this returns.
    pub(crate) async fn open(
        &self,
        conv: &ConversationRef,
        operation: Operation,
    ) -> Result<Opened> {
        let turn = self.turn(&conv.key).await?;
        self.open_in_turn(turn, conv, operation).await
    }

    /// [`AppState::open`] once the turn is this request's.
    async fn open_in_turn(
        &self,
        turn: Turn,
        conv: &ConversationRef,
        operation: Operation,
    ) -> Result<Opened> {
        let held = self.manager.hold(conv).await?;
        let generation = self.sessions.generation();
        if let Some(cached) = self.sessions.take(&conv.key) {
            // Kept from an earlier request: used only while its record is still the one it
            // opened (another process or replica may have destroyed it, or it expired) and the
            // network policy in force is still the one it opened under (a change made through
            // another replica, or with the CLI, reaches the runtime on this request).
            let kept = &cached.conv;
            match self.manager.revalidate(kept, kept.policy_hash()).await {
                Ok(true) => {
                    return Ok(self.opened(cached.conv, false, generation, held, turn, operation));
                }
                Ok(false) => sessions::close_all(vec![cached.conv]).await,
                Err(error) => {
                    sessions::close_all(vec![cached.conv]).await;
                    return Err(error);
                }
            }
        }
        let mode = operation.open_mode();
        let opened = self
            .manager
            .open_held(held, conv, mode)
            .await
            .map_err(|error| with_api_advice(error, mode))?;
        let (conv, held) = opened.into_parts();
        let created = conv.created();
        Ok(self.opened(conv, created, generation, held, turn, operation))
    }
}

impl AppState {
    /// An [`Opened`] of `conv`; a foreground command's session is published for the reads
    /// beside it.
    fn opened(
        &self,
        conv: Conversation,
        created: bool,
        generation: u64,
        held: ConversationLock,
        turn: Turn,
        operation: Operation,
    ) -> Opened {
        let conv = Arc::new(conv);
        let order: Order = Arc::new(std::sync::Mutex::new((held, turn)));
        let published = (operation == Operation::Exec).then(|| {
            self.running
                .publish(&conv.conversation().key, &conv, &order)
        });
        Opened {
            published,
            conv,
            created,
            sessions: self.sessions.clone(),
            generation,
            _order: order,
        }
    }
}

/// What the manager's "expired" refusal ends with (`sessionbox_manager`'s `open.rs`): the API
/// adds how to make the conversation anew in its own words.
const EXPIRED_REFUSAL_END: &str = "and its files are gone";

/// `error`, from opening in `mode`, with the API's advice added to an expired conversation's
/// `not_found`: which requests make a new one.
fn with_api_advice(error: Error, mode: OpenMode) -> Error {
    match &error {
        Error::NotFound(message)
            if mode == OpenMode::ExistingOnly && message.ends_with(EXPIRED_REFUSAL_END) =>
        {
            error.with_advice("exec, write, mkdir or POST /v1/conversations/{id} make a new one")
        }
        _ => error,
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
