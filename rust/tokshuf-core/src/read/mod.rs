//! Reading caches (DESIGN §6-7): opening and validating a cache, the global example order
//! against R*, one rank's batches, reading a cache while it is built (follow mode), blends.

pub mod blend;
mod block_cache;
pub mod buffers;
pub mod cache;
mod chunk;
pub mod follow;
mod gather;
mod id_list;
mod manifest_line;
mod members;
pub mod order;
pub(crate) mod per_process;
pub mod reader;
pub mod remote;
mod stream;
pub mod unpacked;
pub mod validate;
