//! Named volumes: directories that outlive sandboxes and mount into new
//! ones, each under a quota.
//!
//! A volume is a btrfs subvolume of the disk store (`<disk>/volumes/<id>`)
//! with a quota group limit, so a sandbox that fills it gets `EDQUOT` and
//! nothing else is touched. Its files keep the ids sandboxes see (uid 1000
//! is `user`): each tier mounts it idmapped into the sandbox's own range
//! (see the tiers in `airlock_backend`), so a file written in one
//! sandbox belongs to the same user in the next, whatever host ids either
//! ran as.
//!
//! A volume belongs to the API key that made it; names are unique per key.
//! Sandboxes name the volumes they mount in their specs, and a volume a
//! sandbox that is not dead mounts cannot be deleted (409). Its files can
//! also be read and written without a sandbox ([`crate::volume_files`]),
//! with the key or with the volume's own content token.

use airlock_backend::volumes::LocalVolumes;
use airlock_policy::VolumeMount;
use airlock_store::{KeyRow, StoreError, Stream, VolumeRow};
use serde_json::json;

use crate::{Daemon, DaemonError};

/// The uid and gid a new volume's root belongs to, as sandboxes see them:
/// `user`, whom sandboxes run as by default.
pub const VOLUME_OWNER: u32 = 1000;

/// How long a delete waits for the sandboxes that mount the volume and are
/// being torn down.
const STOPPING_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// A volume to mount, as a create names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRequest {
    /// The volume's id or name.
    pub volume: String,
    /// Where inside the sandbox.
    pub target: String,
    pub read_only: bool,
}

/// Whether `name` may name a volume: 1 to 128 of letters, digits, `_` and
/// `-` (e2b's pattern), and not shaped like an id.
pub fn is_volume_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        && !airlock_backend::volumes::is_volume_id(name)
}

impl Daemon {
    /// The disk store volumes live in, or why there is none.
    pub(crate) fn volume_store(&self) -> Result<LocalVolumes, DaemonError> {
        match &self.config().disk_store {
            Some(root) => Ok(LocalVolumes::at(root)),
            None => Err(DaemonError::Unsupported(
                "volumes live on the disk store, which this daemon does not use (serve with --writable-layers disk)".into(),
            )),
        }
    }

    /// Makes volume `name` for `key`, holding at most `quota_bytes` (the
    /// operator's default when `None`).
    pub fn create_volume(
        &self,
        key: &KeyRow,
        name: &str,
        quota_bytes: Option<u64>,
        request_id: &str,
    ) -> Result<VolumeRow, DaemonError> {
        if !is_volume_name(name) {
            return Err(DaemonError::BadInput(format!(
                "{name:?} is not a volume name: use 1 to 128 letters, digits, `_` and `-`"
            )));
        }
        let config = self.config();
        let quota = quota_bytes.unwrap_or(config.volume_default_bytes);
        if quota < 1 << 20 || quota > config.volume_max_bytes {
            return Err(DaemonError::BadInput(format!(
                "a volume's quota must be between 1 MiB and {} bytes",
                config.volume_max_bytes
            )));
        }
        let store = self.volume_store()?;
        let id = airlock_store::new_volume_id()?;
        let row = self.with_store(|s| {
            s.insert_volume(
                &VolumeRow {
                    id: id.clone(),
                    name: name.to_owned(),
                    owner_key_id: key.id.clone(),
                    quota_bytes: quota,
                    created_at: 0,
                },
                config.max_volumes_per_key,
            )
        });
        let row = match row {
            Ok(row) => row,
            Err(StoreError::AlreadyExists { .. }) => {
                return Err(DaemonError::Conflict(format!(
                    "a volume named {name:?} exists already"
                )))
            }
            Err(e) => return Err(e.into()),
        };
        if let Err(e) = store.create(&id, quota, VOLUME_OWNER) {
            let _ = self.with_store(|s| s.delete_volume(&id));
            return Err(DaemonError::Internal(format!(
                "cannot make volume {id}: {}",
                airlock_backend::error_chain(&e)
            )));
        }
        self.inner.audit.record(
            Stream::Runtime,
            "volume.created",
            None,
            Some(request_id),
            json!({"volume_id": id, "name": name, "quota_bytes": quota, "key_id": key.id}),
        );
        Ok(row)
    }

    /// The volume `key` may use by this id or name (its own; an admin's by
    /// id, any).
    pub fn find_volume(&self, key: &KeyRow, id_or_name: &str) -> Result<VolumeRow, DaemonError> {
        let found = if airlock_backend::volumes::is_volume_id(id_or_name) {
            self.with_store(|s| s.get_volume(id_or_name))?
                .filter(|v| key.is_admin || v.owner_key_id == key.id)
        } else {
            self.with_store(|s| s.volume_by_name(&key.id, id_or_name))?
        };
        found.ok_or_else(|| DaemonError::NotFound(format!("there is no volume {id_or_name:?}")))
    }

    /// The volumes `key` may see (its own; an admin every one).
    pub fn volumes(&self, key: &KeyRow) -> Result<Vec<VolumeRow>, DaemonError> {
        let owner = (!key.is_admin).then_some(key.id.as_str());
        Ok(self.with_store(|s| s.list_volumes(owner))?)
    }

    /// A sandbox that is not dead and mounts volume `id`, if one does.
    pub fn volume_user(&self, id: &str) -> Result<Option<String>, DaemonError> {
        Ok(self
            .with_store(|s| s.volume_user(id))?
            .map(|(user, _)| user))
    }

    /// Deletes volume `id_or_name` of `key` and its files; 409 while a
    /// sandbox that is not dead mounts it. Sandboxes still being torn down
    /// (a delete just answered) are waited for, a while.
    pub async fn delete_volume(
        &self,
        key: &KeyRow,
        id_or_name: &str,
        request_id: &str,
    ) -> Result<VolumeRow, DaemonError> {
        let volume = self.find_volume(key, id_or_name)?;
        let deadline = std::time::Instant::now() + STOPPING_WAIT;
        loop {
            match self.with_store(|s| s.volume_user(&volume.id))? {
                Some((_, airlock_store::State::Stopping))
                    if std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                _ => break,
            }
        }
        match self.with_store(|s| s.delete_volume(&volume.id)) {
            Ok(()) | Err(StoreError::NotFound { .. }) => {}
            Err(StoreError::InUse { user, .. }) => {
                return Err(DaemonError::Conflict(format!(
                    "volume {} is mounted by sandbox {user}; delete that sandbox first",
                    volume.name
                )))
            }
            Err(e) => return Err(e.into()),
        }
        if let Ok(store) = self.volume_store() {
            if let Err(e) = store.remove(&volume.id) {
                // Its record is gone: the startup sweep removes what is left.
                tracing::warn!(volume = %volume.id, "cannot remove a volume's files: {}", airlock_backend::error_chain(&e));
            }
        }
        self.inner.audit.record(
            Stream::Runtime,
            "volume.deleted",
            None,
            Some(request_id),
            json!({"volume_id": volume.id, "name": volume.name, "key_id": key.id}),
        );
        Ok(volume)
    }

    /// The content token of volume `id` (the e2b SDKs' bearer token for
    /// its files).
    pub fn volume_token(&self, id: &str) -> String {
        self.inner.token_key.volume_token_for(id)
    }

    /// Volume `id`, if `token` is its content token.
    pub fn volume_for_token(&self, id: &str, token: &str) -> Result<VolumeRow, DaemonError> {
        let not_found = || DaemonError::NotFound(format!("there is no volume {id:?}"));
        if !airlock_backend::volumes::is_volume_id(id)
            || !crate::tokens::same_secret(token, &self.volume_token(id))
        {
            return Err(not_found());
        }
        self.with_store(|s| s.get_volume(id))?.ok_or_else(not_found)
    }

    /// The mounts of `requests` for a sandbox of `key`: each volume found
    /// by id or name among `key`'s and given its place on the host.
    pub fn volume_mounts(
        &self,
        key: &KeyRow,
        requests: &[VolumeRequest],
    ) -> Result<Vec<VolumeMount>, DaemonError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let store = self.volume_store()?;
        requests
            .iter()
            .map(|request| {
                let volume = self.find_volume(key, &request.volume)?;
                airlock_policy::check_target(&request.target)
                    .map_err(|e| DaemonError::BadInput(format!("volume {}: {e}", volume.name)))?;
                Ok(VolumeMount {
                    source: store.path(&volume.id),
                    volume: volume.id,
                    target: request.target.clone(),
                    read_only: request.read_only,
                })
            })
            .collect()
    }

    /// Fails unless every volume `spec` mounts is one `owner` may use, at
    /// its own place on the host (what [`Daemon::volume_mounts`] makes).
    pub(crate) fn check_volumes(
        &self,
        owner: &KeyRow,
        volumes: &[VolumeMount],
    ) -> Result<(), DaemonError> {
        if volumes.is_empty() {
            return Ok(());
        }
        let store = self.volume_store()?;
        for mount in volumes {
            let volume = self.find_volume(owner, &mount.volume)?;
            if mount.source != store.path(&volume.id) {
                return Err(DaemonError::BadInput(format!(
                    "volume {} is not where the daemon keeps it",
                    volume.name
                )));
            }
        }
        Ok(())
    }

    /// At start: removes the files of volumes the store has no record of
    /// (a delete cut short), and makes empty ones for records whose files
    /// are gone (a disk store made anew), so their sandboxes start.
    pub(crate) fn sweep_volumes(&self) {
        let Ok(store) = self.volume_store() else {
            return;
        };
        let rows = match self.with_store(|s| s.list_volumes(None)) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!("cannot list volumes to sweep: {e}");
                return;
            }
        };
        for id in store.ids() {
            if !rows.iter().any(|v| v.id == id) {
                if let Err(e) = store.remove(&id) {
                    tracing::warn!(volume = %id, "cannot remove an unrecorded volume: {}", airlock_backend::error_chain(&e));
                }
            }
        }
        for row in rows {
            if !store.path(&row.id).is_dir() {
                tracing::warn!(volume = %row.id, "volume's files are gone; making it again, empty");
                if let Err(e) = store.create(&row.id, row.quota_bytes, VOLUME_OWNER) {
                    tracing::warn!(volume = %row.id, "cannot make a volume again: {}", airlock_backend::error_chain(&e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_letters_digits_underscores_and_dashes_and_never_ids() {
        for good in ["data", "my-vol_2", "A"] {
            assert!(is_volume_name(good), "{good}");
        }
        let long = "x".repeat(129);
        for bad in ["", "a b", "../x", "a/b", "vol-0123", long.as_str(), "ü"] {
            assert!(!is_volume_name(bad), "{bad}");
        }
    }
}
