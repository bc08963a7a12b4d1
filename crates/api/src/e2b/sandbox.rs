//! Calls into one sandbox: envd (`/files`, `/health`, the Connect services
//! `process.Process` and `filesystem.Filesystem`) and the code interpreter
//! (`/execute`, `/contexts`).

use crate::Api;
use axum::Router;

/// The routes of calls into a sandbox (selected by `E2b-Sandbox-Id`).
pub fn router(api: Api) -> Router {
    Router::new().with_state(api)
}
