//! [`ErrorBody`]: the JSON of every HTTP error answer.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{ErrorCode, Version};

/// `{"version":1,"error":{"code":"…","message":"…"}}`, sent with 400, 401,
/// 403, 404, 409, 413, 422 or 503.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// Always 1.
    pub version: Version,
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The inside of an [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable, machine-readable code, one of [`ErrorCode`]; kept a string
    /// so that a client never fails on a code it does not know.
    pub code: String,
    /// A human-readable explanation.
    pub message: String,
}

impl ErrorBody {
    /// An error body with the given code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            version: Version,
            error: ErrorDetail {
                code: code.as_str().to_owned(),
                message: message.into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape() {
        let e = ErrorBody::new(ErrorCode::Forbidden, "not your inbox");
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(
            json,
            r#"{"version":1,"error":{"code":"forbidden","message":"not your inbox"}}"#
        );
        assert_eq!(serde_json::from_str::<ErrorBody>(&json).unwrap(), e);
        assert_eq!(e.error.code.parse(), Ok(ErrorCode::Forbidden));
    }
}
