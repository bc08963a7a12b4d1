//! The in-sandbox agent.
