//! Templates: names for snapshots, and the default one restored into every new conversation.

use sessionbox_core::{
    ArchiveStats, ConversationRef, Error, Result, Session, TenantId, validate_snapshot_name,
};
use sessionbox_store::SnapshotRecord;

use super::{DEFAULT_TEMPLATE, ForkFrom};
use crate::Manager;

impl Manager {
    /// Makes conversation `to` from the tenant's template `template`, as [`Manager::fork`]
    /// from the snapshot it names.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the tenant has no such template; as [`Manager::fork`].
    pub async fn create_from_template(
        &self,
        to: &ConversationRef,
        template: &str,
    ) -> Result<ArchiveStats> {
        let record = self
            .template_snapshot(&to.tenant, template)
            .await?
            .ok_or_else(|| Error::NotFound(format!("tenant has no template {template:?}")))?;
        self.fork(&ForkFrom::Snapshot(record.name), to).await
    }

    pub(super) async fn template_snapshot(
        &self,
        tenant: &TenantId,
        template: &str,
    ) -> Result<Option<SnapshotRecord>> {
        validate_snapshot_name(template)?;
        let (t, n) = (tenant.clone(), template.to_owned());
        self.store.run(move |s| s.template(&t, &n)).await
    }

    /// Names snapshot `snapshot` as the tenant's template `template` (replacing one of that
    /// name). [`DEFAULT_TEMPLATE`] is restored into every new conversation of the tenant.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an absent snapshot; [`Error::InvalidRequest`] for a bad name.
    pub async fn set_template(
        &self,
        tenant: &TenantId,
        template: &str,
        snapshot: &str,
    ) -> Result<()> {
        validate_snapshot_name(template)?;
        validate_snapshot_name(snapshot)?;
        let (t, n, s2) = (tenant.clone(), template.to_owned(), snapshot.to_owned());
        let r = self.store.run(move |s| s.set_template(&t, &n, &s2)).await;
        self.audit_tenant(
            tenant,
            "template.set",
            &r,
            format!("template={template} snapshot={snapshot}"),
        )
        .await;
        r
    }

    /// Removes the tenant's template `template`; false when it had none.
    ///
    /// # Errors
    /// When the store fails.
    pub async fn remove_template(&self, tenant: &TenantId, template: &str) -> Result<bool> {
        validate_snapshot_name(template)?;
        let (t, n) = (tenant.clone(), template.to_owned());
        let r = self.store.run(move |s| s.remove_template(&t, &n)).await;
        self.audit_tenant(
            tenant,
            "template.remove",
            &r,
            format!("template={template}"),
        )
        .await;
        r
    }

    /// The tenant's templates: (template, snapshot) by template name.
    ///
    /// # Errors
    /// When the store fails.
    pub async fn templates(&self, tenant: &TenantId) -> Result<Vec<(String, String)>> {
        let t = tenant.clone();
        self.store.run(move |s| s.templates(&t)).await
    }

    /// Restores the tenant's [`DEFAULT_TEMPLATE`], if it has one and snapshots are on, into
    /// `session`, a conversation just created. Returns the audit detail.
    pub(crate) async fn apply_default_template(
        &self,
        conversation: &ConversationRef,
        session: &dyn Session,
    ) -> Result<Option<String>> {
        let Some(config) = self.snapshots.clone() else {
            return Ok(None);
        };
        let Some(record) = self
            .template_snapshot(&conversation.tenant, DEFAULT_TEMPLATE)
            .await?
        else {
            return Ok(None);
        };
        let _slot = self.snapshot_slot(&conversation.tenant)?;
        let tar = self.unpack(&config, &record).await?;
        let stats = session.restore_workspace(&tar.0).await?;
        Ok(Some(format!(
            "template={DEFAULT_TEMPLATE} snapshot={} files={} bytes={}",
            record.name, stats.files, stats.bytes
        )))
    }
}
