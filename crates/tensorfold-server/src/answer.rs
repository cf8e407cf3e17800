//! What a completion route hands its reply besides the prompt and the validated fields: the route (chat or
//! completions), the text `echo` prepends, and the request's access-log entry.

use crate::access_log::Entry;
use crate::reply::Shape;

/// How one request is answered.
#[derive(Clone, Default)]
pub struct Answer {
    /// The chat route (else completions).
    pub chat: bool,
    /// Text prepended to every choice (`echo: true` on completions; `echo.rs`).
    pub echo: Option<String>,
    /// The access-log line the reply's outcome goes to.
    pub log: Entry,
}

impl Answer {
    /// A fresh reply shape for `model` (a new id, recorded on the access-log line).
    pub fn shape(&self, model: String) -> Shape {
        let shape = Shape::new(self.chat, model).with_echo(self.echo.clone());
        self.log.id(&shape.id);
        shape
    }
}
