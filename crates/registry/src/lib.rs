//! The registry client: image references, the distribution protocol, credentials, the address
//! guard, and the cache in front of them.

pub mod client;
pub mod credentials;
pub mod entrypoint;
pub mod error;
pub mod guard;
pub mod hosts;
pub mod identity;
pub mod inspector;
pub mod metrics;
pub mod reference;

pub use client::{ClientSettings, Inspection, RegistryClient};
pub use credentials::{Credential, Keyring};
pub use entrypoint::{Bound, EntrypointCheck, EntrypointLimits, Undetermined};
pub use error::RegistryError;
pub use guard::AddressGuard;
pub use identity::{RegistryIdentity, TokenCache};
pub use inspector::{CacheSettings, Inspector};
pub use reference::ImageRef;
