//! Engine-aware routing next to self-hosted inference engines (vLLM, SGLang, llama.cpp,
//! Ollama, TGI): the engines' load signals and the prompt-prefix hashes `lb = "load"` uses.
//!
//! - `prefix`: chained block hashes of a request's prompt, the per-engine prefix index.
//!
//! Owns: everything engine-specific on the gateway side. Must not: write to clients.

pub mod prefix;
