//! TensorFold lane core; for now the keyed sampler every draw goes through and the solo (one-stream)
//! generation loop that later shared rounds must equal.
pub mod sampler;
pub mod solo;
