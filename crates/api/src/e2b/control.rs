//! The e2b control plane: `/sandboxes`, `/v2/sandboxes` and friends.

use crate::Api;
use axum::Router;

/// The control-plane routes.
pub fn router(api: Api) -> Router {
    Router::new().with_state(api)
}
