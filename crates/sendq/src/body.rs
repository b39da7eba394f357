//! [`Body`]: what an entry carries for its transport, shared by the
//! admission of new entries and the state that files and sends them.

/// What an entry carries for its transport: its host and payload. A send
/// worker holds it (moved, not copied or shared) while it writes the entry.
pub(crate) struct Body<H, P> {
    pub(crate) host: H,
    pub(crate) payload: P,
}
