//! The what-if window driven headless (egui_kittest): controls, results and how the layout wraps.

mod interaction;
mod layout;
