//! Pure decision tests for the agent.
