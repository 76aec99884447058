//! GPU text trainer (placeholder).
