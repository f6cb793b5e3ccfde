//! Files in the page: uploads through a file input (read as text), downloads through a Blob
//! URL on an anchor, and PNG charts drawn by the browser from the engine's SVG (plotters
//! draws no text into bitmaps on wasm).

use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{
    Blob, BlobPropertyBag, CanvasRenderingContext2d, Document, HtmlAnchorElement,
    HtmlCanvasElement, HtmlImageElement, HtmlInputElement, Url,
};

/// What an upload is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadKind {
    /// A configuration, TOML or JSON (by the file's name), as `parsim --config` reads it.
    Config,
    /// A Hugging Face `config.json`, imported as the model.
    HfConfig,
}

/// A file the user picked, read as text.
#[derive(Debug)]
pub struct Upload {
    pub kind: UploadKind,
    pub name: String,
    pub text: Result<String, String>,
}

/// Where a finished upload waits for the next frame.
pub type UploadSlot = Rc<RefCell<Option<Upload>>>;

fn document() -> Result<Document, JsValue> {
    web_sys::window()
        .and_then(|w| w.document())
        .ok_or_else(|| JsValue::from_str("no document"))
}

fn js_err(e: JsValue) -> String {
    e.as_string().unwrap_or_else(|| format!("{e:?}"))
}

/// Opens the browser's file picker (`accept`: ".toml,.json"); the file's text lands in
/// `slot` and `wake` asks for a frame.
pub fn pick(
    kind: UploadKind,
    accept: &str,
    slot: &UploadSlot,
    wake: impl Fn() + 'static,
) -> Result<(), String> {
    let input: HtmlInputElement = document()
        .and_then(|d| d.create_element("input"))
        .and_then(|e| e.dyn_into().map_err(JsValue::from))
        .map_err(js_err)?;
    input.set_type("file");
    input.set_accept(accept);
    let slot = Rc::clone(slot);
    let picked = input.clone();
    let on_change = Closure::once_into_js(move || {
        let Some(file) = picked.files().and_then(|f| f.get(0)) else {
            return;
        };
        let name = file.name();
        wasm_bindgen_futures::spawn_local(async move {
            let text = wasm_bindgen_futures::JsFuture::from(file.text())
                .await
                .map(|t| t.as_string().unwrap_or_default())
                .map_err(|e| format!("cannot read {name}: {}", js_err(e)));
            *slot.borrow_mut() = Some(Upload { kind, name, text });
            wake();
        });
    });
    input.set_onchange(Some(on_change.unchecked_ref()));
    input.click();
    Ok(())
}

fn blob(bytes: &str, mime: &str) -> Result<Blob, JsValue> {
    let parts = js_sys::Array::of1(&JsValue::from_str(bytes));
    let options = BlobPropertyBag::new();
    options.set_type(mime);
    Blob::new_with_str_sequence_and_options(&parts, &options)
}

fn click_download(href: &str, name: &str) -> Result<(), JsValue> {
    let a: HtmlAnchorElement = document()?.create_element("a")?.dyn_into()?;
    a.set_href(href);
    a.set_download(name);
    a.click();
    Ok(())
}

/// Offers `text` as a download called `name`.
pub fn download_text(name: &str, text: &str, mime: &str) -> Result<(), String> {
    let url = blob(text, mime)
        .and_then(|b| Url::create_object_url_with_blob(&b))
        .map_err(js_err)?;
    let r = click_download(&url, name).map_err(js_err);
    Url::revoke_object_url(&url).map_err(js_err)?;
    r
}

/// Offers `svg` (of `size` pixels) as a PNG called `name`, drawn by the browser.
pub fn download_svg_as_png(name: &str, svg: &str, size: (u32, u32)) -> Result<(), String> {
    let url = blob(svg, "image/svg+xml")
        .and_then(|b| Url::create_object_url_with_blob(&b))
        .map_err(js_err)?;
    let img = HtmlImageElement::new().map_err(js_err)?;
    let canvas: HtmlCanvasElement = document()
        .and_then(|d| d.create_element("canvas"))
        .and_then(|e| e.dyn_into().map_err(JsValue::from))
        .map_err(js_err)?;
    canvas.set_width(size.0);
    canvas.set_height(size.1);
    let (drawn, name, object_url) = (img.clone(), name.to_string(), url.clone());
    let on_load = Closure::once_into_js(move || {
        let r = (|| -> Result<(), JsValue> {
            let ctx: CanvasRenderingContext2d = canvas
                .get_context("2d")?
                .ok_or_else(|| JsValue::from_str("no 2d context"))?
                .dyn_into()?;
            ctx.draw_image_with_html_image_element(&drawn, 0.0, 0.0)?;
            click_download(&canvas.to_data_url_with_type("image/png")?, &name)
        })();
        if let Err(e) = r {
            log::warn!("cannot draw {name}: {}", js_err(e));
        }
        Url::revoke_object_url(&object_url).ok();
    });
    img.set_onload(Some(on_load.unchecked_ref()));
    img.set_src(&url);
    Ok(())
}
