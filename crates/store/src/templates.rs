//! The `layers`, `templates`, `template_layers` and `sandbox_layers`
//! tables: which templates exist, what they stack, and which layers are
//! still referenced.

use rusqlite::{params, ErrorCode, OptionalExtension, Row};

use crate::{json_column, now_millis, Entity, Store, StoreError};

/// A layer of the store, by its `diff_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRow {
    /// `sha256:` and 64 hex digits: the digest of its uncompressed tar.
    pub diff_id: String,
    /// Bytes of regular files unpacked.
    pub bytes: u64,
    /// Entries unpacked.
    pub entries: u64,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// A template: a named stack of layers and how its sandboxes start.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateRow {
    /// Its name, as `"template": NAME` gives it.
    pub name: String,
    /// `sha256:` and 64 hex digits of its image configuration.
    pub digest: String,
    /// Where it came from.
    pub source: String,
    /// How its sandboxes start (a JSON object).
    pub config: serde_json::Value,
    /// Its layers' `diff_id`s, bottom first.
    pub layers: Vec<String>,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The tier its sandboxes run on when a create names none (`None`:
    /// the daemon's default). A tier's name; the store does not judge it.
    pub tier: Option<String>,
}

/// A template to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTemplate {
    pub name: String,
    pub digest: String,
    pub source: String,
    /// Must be a JSON object.
    pub config: serde_json::Value,
    /// `diff_id`s, bottom first; each must be a recorded layer.
    pub layers: Vec<String>,
}

fn layer_from_row(row: &Row<'_>) -> rusqlite::Result<LayerRow> {
    Ok(LayerRow {
        diff_id: row.get(0)?,
        bytes: row.get::<_, i64>(1)?.max(0) as u64,
        entries: row.get::<_, i64>(2)?.max(0) as u64,
        created_at: row.get(3)?,
    })
}

impl Store {
    /// Records an unpacked layer; a layer recorded already is left as it
    /// is (the same content, named by its digest).
    pub fn record_layer(&self, diff_id: &str, bytes: u64, entries: u64) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(
                "INSERT INTO layers (diff_id, bytes, entries, created_at) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (diff_id) DO NOTHING",
            )?
            .execute(params![
                diff_id,
                i64::try_from(bytes).unwrap_or(i64::MAX),
                i64::try_from(entries).unwrap_or(i64::MAX),
                now_millis()
            ])?;
        Ok(())
    }

    /// The layer `diff_id`, if recorded.
    pub fn get_layer(&self, diff_id: &str) -> Result<Option<LayerRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT diff_id, bytes, entries, created_at FROM layers WHERE diff_id = ?1",
            )?
            .query_row([diff_id], layer_from_row)
            .optional()?)
    }

    /// Every recorded layer.
    pub fn layers(&self) -> Result<Vec<LayerRow>, StoreError> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT diff_id, bytes, entries, created_at FROM layers ORDER BY diff_id",
            )?
            .query_map([], layer_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Records a template, replacing one of the same name (its old layers
    /// stay until nothing references them; its tier carries over, since
    /// the tier belongs to the name). All or nothing.
    pub fn put_template(&self, new: &NewTemplate) -> Result<TemplateRow, StoreError> {
        if !new.config.is_object() {
            return Err(StoreError::InvalidJson {
                field: "config_json",
                expected: "a JSON object",
            });
        }
        let created_at = now_millis();
        let tx = self.conn.unchecked_transaction()?;
        let tier: Option<String> = self
            .conn
            .prepare_cached("SELECT tier FROM templates WHERE name = ?1")?
            .query_row([&new.name], |row| row.get(0))
            .optional()?
            .flatten();
        self.conn
            .prepare_cached("DELETE FROM templates WHERE name = ?1")?
            .execute([&new.name])?;
        self.conn
            .prepare_cached(
                "INSERT INTO templates (name, digest, source, config_json, created_at, tier) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                new.name,
                new.digest,
                new.source,
                new.config.to_string(),
                created_at,
                tier
            ])?;
        self.insert_layer_stack(
            "INSERT INTO template_layers (template, position, diff_id) VALUES (?1, ?2, ?3)",
            &new.name,
            &new.layers,
        )?;
        tx.commit()?;
        Ok(TemplateRow {
            name: new.name.clone(),
            digest: new.digest.clone(),
            source: new.source.clone(),
            config: new.config.clone(),
            layers: new.layers.clone(),
            created_at,
            tier,
        })
    }

    /// Inserts `layers`, bottom first, as the stack of `owner` with `sql`
    /// (an `INSERT` of owner, position and diff_id), inside the caller's
    /// transaction; a layer that is not recorded is
    /// [`StoreError::NotFound`].
    pub(crate) fn insert_layer_stack(
        &self,
        sql: &str,
        owner: &str,
        layers: &[String],
    ) -> Result<(), StoreError> {
        for (position, diff_id) in layers.iter().enumerate() {
            let inserted =
                self.conn
                    .prepare_cached(sql)?
                    .execute(params![owner, position as i64, diff_id]);
            if let Err(rusqlite::Error::SqliteFailure(e, _)) = &inserted {
                if e.code == ErrorCode::ConstraintViolation {
                    return Err(StoreError::NotFound {
                        kind: Entity::Layer,
                        id: diff_id.clone(),
                    });
                }
            }
            inserted?;
        }
        Ok(())
    }

    /// Sets (or with `None` clears) the tier of template `name`.
    pub fn set_template_tier(&self, name: &str, tier: Option<&str>) -> Result<(), StoreError> {
        let changed = self
            .conn
            .prepare_cached("UPDATE templates SET tier = ?2 WHERE name = ?1")?
            .execute(params![name, tier])?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                kind: Entity::Template,
                id: name.to_owned(),
            });
        }
        Ok(())
    }

    /// The template `name`, if recorded.
    pub fn get_template(&self, name: &str) -> Result<Option<TemplateRow>, StoreError> {
        let row = self
            .conn
            .prepare_cached(
                "SELECT name, digest, source, config_json, created_at, tier \
                 FROM templates WHERE name = ?1",
            )?
            .query_row([name], |row| {
                Ok(TemplateRow {
                    name: row.get(0)?,
                    digest: row.get(1)?,
                    source: row.get(2)?,
                    config: json_column(row, 3)?,
                    layers: Vec::new(),
                    created_at: row.get(4)?,
                    tier: row.get(5)?,
                })
            })
            .optional()?;
        let Some(mut template) = row else {
            return Ok(None);
        };
        template.layers = self
            .conn
            .prepare_cached(
                "SELECT diff_id FROM template_layers WHERE template = ?1 ORDER BY position",
            )?
            .query_map([name], |row| row.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(Some(template))
    }

    /// Every template, by name.
    pub fn templates(&self) -> Result<Vec<TemplateRow>, StoreError> {
        let names: Vec<String> = self
            .conn
            .prepare_cached("SELECT name FROM templates ORDER BY name")?
            .query_map([], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        let mut templates = Vec::with_capacity(names.len());
        for name in names {
            if let Some(template) = self.get_template(&name)? {
                templates.push(template);
            }
        }
        Ok(templates)
    }

    /// Removes the template `name` (its layers stay until the collector
    /// finds nothing references them).
    pub fn delete_template(&self, name: &str) -> Result<(), StoreError> {
        let changed = self
            .conn
            .prepare_cached("DELETE FROM templates WHERE name = ?1")?
            .execute([name])?;
        if changed == 0 {
            return Err(StoreError::NotFound {
                kind: Entity::Template,
                id: name.to_owned(),
            });
        }
        Ok(())
    }

    /// Records that sandbox `id` runs on `layers` (each must be recorded),
    /// so they stay while it is not dead.
    pub fn set_sandbox_layers(&self, id: &str, layers: &[String]) -> Result<(), StoreError> {
        let tx = self.conn.unchecked_transaction()?;
        self.insert_sandbox_layers(id, layers)?;
        tx.commit()?;
        Ok(())
    }

    /// [`Store::set_sandbox_layers`] inside the caller's transaction.
    pub(crate) fn insert_sandbox_layers(
        &self,
        id: &str,
        layers: &[String],
    ) -> Result<(), StoreError> {
        for diff_id in layers {
            let inserted = self
                .conn
                .prepare_cached(
                    "INSERT INTO sandbox_layers (sandbox_id, diff_id) VALUES (?1, ?2) \
                     ON CONFLICT DO NOTHING",
                )?
                .execute(params![id, diff_id]);
            if let Err(rusqlite::Error::SqliteFailure(e, _)) = &inserted {
                if e.code == ErrorCode::ConstraintViolation {
                    return Err(StoreError::NotFound {
                        kind: Entity::Layer,
                        id: diff_id.clone(),
                    });
                }
            }
            inserted?;
        }
        Ok(())
    }

    /// The layers nothing references: no template stacks them, no
    /// sandbox that is not dead runs on them, no snapshot stacks them and no build step caches them. Dead sandboxes' references
    /// are dropped first.
    pub fn unreferenced_layers(&self) -> Result<Vec<String>, StoreError> {
        self.conn
            .prepare_cached(
                "DELETE FROM sandbox_layers WHERE sandbox_id IN \
                 (SELECT id FROM sandboxes WHERE state = 'dead')",
            )?
            .execute([])?;
        Ok(self
            .conn
            .prepare_cached(
                "SELECT diff_id FROM layers l WHERE \
                 NOT EXISTS (SELECT 1 FROM template_layers t WHERE t.diff_id = l.diff_id) AND \
                 NOT EXISTS (SELECT 1 FROM sandbox_layers s WHERE s.diff_id = l.diff_id) AND \
                 NOT EXISTS (SELECT 1 FROM snapshot_layers p WHERE p.diff_id = l.diff_id) AND \
                 NOT EXISTS (SELECT 1 FROM build_steps b WHERE b.diff_id = l.diff_id) \
                 ORDER BY diff_id",
            )?
            .query_map([], |row| row.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?)
    }

    /// Forgets the layer `diff_id` if nothing references it (after its
    /// files went); `false` when something does, or it is not recorded.
    pub fn forget_layer(&self, diff_id: &str) -> Result<bool, StoreError> {
        let changed = self
            .conn
            .prepare_cached(
                "DELETE FROM layers WHERE diff_id = ?1 AND \
                 NOT EXISTS (SELECT 1 FROM template_layers t WHERE t.diff_id = ?1) AND \
                 NOT EXISTS (SELECT 1 FROM sandbox_layers s WHERE s.diff_id = ?1) AND \
                 NOT EXISTS (SELECT 1 FROM snapshot_layers p WHERE p.diff_id = ?1) AND \
                 NOT EXISTS (SELECT 1 FROM build_steps b WHERE b.diff_id = ?1)",
            )?
            .execute([diff_id])?;
        Ok(changed > 0)
    }

    /// How many templates, snapshots and sandboxes that are not dead
    /// reference the layer `diff_id`.
    pub fn layer_references(&self, diff_id: &str) -> Result<u64, StoreError> {
        let count: i64 = self
            .conn
            .prepare_cached(
                "SELECT (SELECT count(*) FROM template_layers WHERE diff_id = ?1) + \
             (SELECT count(*) FROM snapshot_layers WHERE diff_id = ?1) + \
             (SELECT count(*) FROM sandbox_layers s JOIN sandboxes b ON b.id = s.sandbox_id \
              WHERE s.diff_id = ?1 AND b.state <> 'dead')",
            )?
            .query_row([diff_id], |row| row.get(0))?;
        Ok(count.max(0) as u64)
    }
}
