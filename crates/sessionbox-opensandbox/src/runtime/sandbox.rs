//! The conversation's sandbox on the server: found or made (insert-if-absent in the
//! directory's map), renewed, resumed, swept.

use super::session::policy_in_force;
use super::*;

impl OpenSandboxRuntime {
    /// The boundary this runtime gives, in one sentence.
    pub const BOUNDARY: &'static str = "an OpenSandbox sandbox (a container on the server's Docker or Kubernetes) per conversation, running sessionbox's agent as execd; the boundary is the server's container runtime and its settings";

    /// A runtime asking `directory` for the conversation-to-sandbox map and the network policy
    /// in force (`sessionbox_manager::StoreDirectory` answers from the store).
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] for a malformed server address, instance name, or a timeout
    /// under 60 s.
    pub fn new(config: OpenSandboxConfig, directory: Arc<dyn Directory>) -> Result<Self> {
        let client = OpenSandboxClient::new(config.client.clone()).map_err(to_core_error)?;
        if !crate::metadata::is_valid_value(&config.instance) || config.instance.is_empty() {
            return Err(Error::InvalidRequest(format!(
                "the OpenSandbox instance name {:?} must be 1-63 of A-Z a-z 0-9 . _ - starting \
                 and ending with a letter or digit",
                config.instance
            )));
        }
        if config.timeout.as_secs() < crate::lifecycle::MIN_TIMEOUT_SECS {
            return Err(Error::InvalidRequest(format!(
                "the OpenSandbox sandbox timeout must be at least {} s",
                crate::lifecycle::MIN_TIMEOUT_SECS
            )));
        }
        Ok(OpenSandboxRuntime {
            client,
            directory,
            config: Arc::new(config),
            in_use: InUse::default(),
            paths: Default::default(),
            pool_refill: Arc::default(),
        })
    }

    /// The lifecycle client.
    pub fn client(&self) -> &OpenSandboxClient {
        &self.client
    }

    /// The metadata every sandbox of this installation carries.
    pub fn instance_metadata(&self) -> Metadata {
        let mut m = Metadata::new();
        m.insert(LABEL_MANAGED, "true").expect("a constant label");
        m.insert(LABEL_INSTANCE, &self.config.instance)
            .expect("checked in new");
        m
    }

    /// Every sandbox on the server that this installation made (by metadata), whether or not
    /// the store still maps a conversation to it.
    ///
    /// # Errors
    /// Lifecycle failures.
    pub async fn server_inventory(&self) -> Result<Vec<crate::Sandbox>> {
        let filter = ListFilter {
            metadata: self.instance_metadata(),
            states: Vec::new(),
        };
        self.client.list(&filter).await.map_err(to_core_error)
    }

    /// The sandbox id the store maps `key` to, if any.
    ///
    /// # Errors
    /// Store failures.
    pub async fn sandbox_id(&self, key: &ConversationKey) -> Result<Option<String>> {
        self.directory
            .remote_sandbox(key)
            .await
            .map(|r| r.map(|r| r.sandbox_id))
    }

    /// The expiry the store holds for `key`'s sandbox (the source of truth).
    ///
    /// # Errors
    /// Store failures.
    pub async fn recorded_expiry(&self, key: &ConversationKey) -> Result<Option<DateTime<Utc>>> {
        self.directory
            .remote_sandbox(key)
            .await
            .map(|r| r.and_then(|r| r.expires_at))
    }

    /// `now + timeout`, in whole milliseconds (what the store keeps).
    pub(super) fn expiry_from_now(&self) -> DateTime<Utc> {
        let t = Utc::now()
            + chrono::Duration::from_std(self.config.timeout).unwrap_or(chrono::Duration::zero());
        DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
    }

    /// The `networkPolicy` a new sandbox of `conversation` gets, with its [`LABEL_NETWORK`]
    /// value; `None` when the option is off.
    async fn network_policy(
        &self,
        conversation: &ConversationRef,
    ) -> Result<Option<(serde_json::Value, &'static str)>> {
        if !self.config.egress.network_policy {
            return Ok(None);
        }
        let policy = policy_in_force(&*self.directory, conversation).await?;
        let gateway = self
            .config
            .egress
            .gateway
            .as_ref()
            .map(GatewayAccess::address);
        Ok(Some(match gateway {
            Some(host) if !policy.is_none() => (
                sessionbox_egress::opensandbox::gateway_only(&policy, &host)
                    .map_err(|e| Error::InvalidRequest(e.to_string()))?,
                "gateway",
            ),
            _ => (sessionbox_egress::opensandbox::deny_all(), "none"),
        }))
    }

    async fn create_sandbox(
        &self,
        conversation: &ConversationRef,
    ) -> Result<(String, DateTime<Utc>)> {
        let key = &conversation.key;
        let mut metadata = self.instance_metadata();
        metadata
            .insert(LABEL_CONVERSATION, &conversation_label(key))
            .map_err(to_core_error)?;
        let network_policy = match self.network_policy(conversation).await? {
            Some((policy, label)) => {
                metadata
                    .insert(LABEL_NETWORK, label)
                    .map_err(to_core_error)?;
                Some(policy)
            }
            None => None,
        };
        let mut volumes = Vec::new();
        if let Some(v) = self.config.volumes.clone() {
            let k = key.clone();
            let (workspace, tmp) = tokio::task::spawn_blocking(move || v.prepare(&k))
                .await
                .map_err(|e| Error::Backend(format!("the volume setup panicked: {e}")))??;
            volumes = vec![
                crate::lifecycle::HostVolume {
                    name: "workspace".into(),
                    host_path: workspace,
                    mount_path: WORKSPACE.into(),
                },
                crate::lifecycle::HostVolume {
                    name: "tmp".into(),
                    host_path: tmp,
                    mount_path: "/tmp".into(),
                },
            ];
        }
        let request = CreateSandbox {
            volumes,
            image: self.config.image.clone(),
            entrypoint: self.config.entrypoint.clone(),
            timeout: Some(self.config.timeout),
            metadata,
            resource_limits: self.config.resource_limits.clone(),
            env: match &self.config.agent_key {
                Some(k) => {
                    BTreeMap::from([("EXECD_ACCESS_TOKEN".to_owned(), k.agent_token(key.as_str()))])
                }
                None => BTreeMap::new(),
            },
            network_policy,
        };
        let expires = self.expiry_from_now();
        match self.client.create(&request).await {
            Ok(s) => Ok((s.id, s.expires_at.unwrap_or(expires))),
            Err(e) => {
                // A create that timed out or failed mid-way may still have made a sandbox:
                // find it by its labels and delete it, so nothing leaks.
                match e {
                    // The server may still be making it: keep looking for a while.
                    OpenSandboxError::Timeout { .. } | OpenSandboxError::Connect { .. } => {
                        self.sweep_until_quiet(key).await;
                    }
                    OpenSandboxError::Api { .. } => {
                        self.sweep_unrecorded(key).await;
                    }
                    _ => {}
                }
                Err(to_core_error(e))
            }
        }
    }

    /// After a create whose answer was lost: sweeps every half second until nothing
    /// unrecorded has been seen for three seconds (or twenty seconds passed), so a sandbox the
    /// server finished making after we gave up is deleted too.
    async fn sweep_until_quiet(&self, key: &ConversationKey) {
        let start = Instant::now();
        let mut quiet_since = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if self.sweep_unrecorded(key).await > 0 {
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= Duration::from_secs(3) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Deletes the sandboxes labelled for `key` that the store does not map to it; returns
    /// how many it found.
    pub(super) async fn sweep_unrecorded(&self, key: &ConversationKey) -> usize {
        let recorded = self.sandbox_id(key).await.ok().flatten();
        let mut metadata = self.instance_metadata();
        if metadata
            .insert(LABEL_CONVERSATION, &conversation_label(key))
            .is_err()
        {
            return 0;
        }
        let filter = ListFilter {
            metadata,
            states: Vec::new(),
        };
        let mut n = 0;
        if let Ok(found) = self.client.list(&filter).await {
            for s in found {
                if Some(&s.id) != recorded.as_ref() {
                    n += 1;
                    let _ = self.client.delete(&s.id).await;
                }
            }
        }
        n
    }

    /// Finds, binds from the warm pool, or makes the conversation's sandbox: `(sandbox id,
    /// whether a vanished one was replaced, what its agent token derives from)`.
    pub(super) async fn ensure_sandbox(
        &self,
        conversation: &ConversationRef,
    ) -> Result<(String, bool, String)> {
        let key = &conversation.key;
        let mut lost = false;
        for _ in 0..5 {
            let recorded = self.directory.remote_sandbox(key).await?;
            let Some(record) = recorded else {
                if let Some((id, subject)) = self.bind_from_pool(conversation).await? {
                    return Ok((id, lost, subject));
                }
                let (id, expires) = self.create_sandbox(conversation).await?;
                let inserted = self
                    .directory
                    .record_remote_sandbox(key, RUNTIME_NAME, &id, Some(expires))
                    .await;
                match inserted {
                    Ok((_, true)) => return Ok((id, lost, key.as_str().to_owned())),
                    Ok((winner, false)) => {
                        // Another open won: delete only our own sandbox, by id, and use theirs.
                        tracing::debug!(ours = %id, theirs = %winner.sandbox_id, "lost the create race");
                        let _ = self.client.delete(&id).await;
                        continue;
                    }
                    Err(e) => {
                        let _ = self.client.delete(&id).await;
                        return Err(e);
                    }
                }
            };
            match self.client.get(&record.sandbox_id).await {
                Ok(s) if !s.status.state.is_final() => {
                    self.check_network_label(conversation, &s).await;
                    if matches!(s.status.state, SandboxState::Paused | SandboxState::Pausing) {
                        self.resume(&s.id).await?;
                    }
                    self.renew_if_due(key, &record.sandbox_id, record.expires_at)
                        .await?;
                    let subject = super::pool::token_subject(key, &s.metadata);
                    return Ok((record.sandbox_id, lost, subject));
                }
                Ok(_) | Err(OpenSandboxError::NotFound { .. }) => {
                    // Vanished: expired, deleted elsewhere, or failed. Replace it.
                    if self.config.volumes.is_some() {
                        tracing::warn!(
                            sandbox = %record.sandbox_id,
                            "the conversation's sandbox vanished; starting a fresh one on the \
                             same volume (its files are kept)"
                        );
                    } else {
                        tracing::warn!(
                            sandbox = %record.sandbox_id,
                            "the conversation's sandbox vanished; starting a fresh one (its files \
                             are lost)"
                        );
                    }
                    let _ = self.client.delete(&record.sandbox_id).await;
                    self.paths.forget(&record.sandbox_id);
                    let (id, expires) = self.create_sandbox(conversation).await?;
                    let replaced = self
                        .directory
                        .replace_remote_sandbox(key, &record.sandbox_id, &id, Some(expires))
                        .await;
                    // With a volume, the files were not in the sandbox: nothing is lost.
                    let files_lost = self.config.volumes.is_none();
                    match replaced {
                        Ok(true) => return Ok((id, files_lost, key.as_str().to_owned())),
                        Ok(false) => {
                            let _ = self.client.delete(&id).await;
                            lost = files_lost;
                            continue;
                        }
                        Err(e) => {
                            let _ = self.client.delete(&id).await;
                            return Err(e);
                        }
                    }
                }
                Err(e) => return Err(to_core_error(e)),
            }
        }
        Err(Error::Backend(
            "the conversation's sandbox kept changing under concurrent opens; retry".into(),
        ))
    }

    /// A sandbox keeps the `networkPolicy` it was created with. When the conversation's
    /// profile has since switched (its label no longer matches), this says so in the log: a
    /// switch to `none` is still enforced by the gateway (which refuses everything under
    /// `none`), a switch to an allowlist reaches a sandbox made afterwards (destroy the
    /// conversation to get one).
    async fn check_network_label(&self, conversation: &ConversationRef, s: &crate::Sandbox) {
        let Some(have) = s.metadata.get(LABEL_NETWORK) else {
            return;
        };
        if let Ok(Some((_, want))) = self.network_policy(conversation).await
            && have != want
        {
            tracing::warn!(
                sandbox = %s.id,
                created_with = %have,
                now = %want,
                "the conversation's network profile changed since its sandbox was created; \
                 the sandbox keeps its networkPolicy until it is replaced"
            );
        }
    }

    /// Renews the sandbox to `now + timeout` when half the timeout has passed since the last
    /// renewal, or when the store holds no expiry. The store's expiry is written first-hand.
    pub(super) async fn renew_if_due(
        &self,
        key: &ConversationKey,
        id: &str,
        recorded: Option<DateTime<Utc>>,
    ) -> Result<()> {
        let half = chrono::Duration::from_std(self.config.timeout / 2).unwrap_or_default();
        let due = recorded.is_none_or(|t| t - Utc::now() < half);
        if !due {
            return Ok(());
        }
        self.renew(key, id).await.map(drop)
    }

    /// Renews `key`'s sandbox `id` to `now + timeout` on the server and in the store.
    async fn renew(&self, key: &ConversationKey, id: &str) -> Result<DateTime<Utc>> {
        let target = self.expiry_from_now();
        self.client.renew(id, target).await.map_err(to_core_error)?;
        self.directory
            .set_remote_sandbox_expiry(key, id, Some(target))
            .await?;
        Ok(target)
    }

    /// Resumes a paused sandbox. A 409 (it is not paused: another open resumed it meanwhile)
    /// is fine when the sandbox is now running or resuming.
    async fn resume(&self, id: &str) -> Result<()> {
        match self.client.resume(id).await {
            Ok(()) => Ok(()),
            Err(e @ OpenSandboxError::Api { status: 409, .. }) => match self.client.get(id).await {
                Ok(s)
                    if matches!(
                        s.status.state,
                        SandboxState::Running | SandboxState::Resuming
                    ) =>
                {
                    Ok(())
                }
                _ => Err(to_core_error(e)),
            },
            Err(e) => Err(to_core_error(e)),
        }
    }

    /// The mapped sandbox of `key` when the server says it is running, with what its agent
    /// token derives from: what an idle stop would pause. `None` for no mapping, a sandbox
    /// gone, or one in any other state.
    pub(super) async fn running_sandbox(
        &self,
        key: &ConversationKey,
    ) -> Result<Option<(String, String)>> {
        let Some(id) = self.sandbox_id(key).await? else {
            return Ok(None);
        };
        match self.client.get(&id).await {
            Ok(s) if s.status.state == SandboxState::Running => {
                let subject = super::pool::token_subject(key, &s.metadata);
                Ok(Some((id, subject)))
            }
            Ok(_) | Err(OpenSandboxError::NotFound { .. }) => Ok(None),
            Err(e) => Err(to_core_error(e)),
        }
    }

    /// Renews `key`'s sandbox now, whatever its recorded expiry; returns the new expiry.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the store maps no sandbox to `key`; lifecycle failures.
    pub async fn renew_now(&self, key: &ConversationKey) -> Result<DateTime<Utc>> {
        let id = self
            .sandbox_id(key)
            .await?
            .ok_or_else(|| Error::NotFound("the conversation has no OpenSandbox sandbox".into()))?;
        self.renew(key, &id).await
    }

    /// How many background commands the agent of the running sandbox `id` runs now (its
    /// `GET /sessionbox/v1/commands`), `None` for none. Garbage collection asks before it
    /// pauses a sandbox: the commands are owned by the agent, not by this process, so only
    /// the agent knows.
    ///
    /// # Errors
    /// [`Error::Backend`] when the agent cannot be reached or answers badly.
    pub(super) async fn running_background(
        &self,
        id: &str,
        subject: &str,
    ) -> Result<Option<usize>> {
        let client = self.connect(id, subject).await?;
        let commands = client.background_commands().await.map_err(|e| {
            Error::Backend(format!(
                "cannot ask the agent of sandbox {id} whether a background command runs: {e}"
            ))
        })?;
        let n = commands.iter().filter(|c| c.running).count();
        Ok((n > 0).then_some(n))
    }
}
