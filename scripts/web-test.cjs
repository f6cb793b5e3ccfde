// The browser half of scripts/web-test.sh (which sets the environment): drives Debian's
// Chromium through playwright-core. Exits nonzero, saying why, when a check fails.
"use strict";
const { chromium } = require(process.env.PLAYWRIGHT_CORE);

const env = (k) => {
  if (process.env[k] === undefined) throw new Error(`web-test: ${k} is not set`);
  return process.env[k];
};
const failures = [];
const check = (ok, what) => {
  console.log(`web-test: ${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures.push(what);
};

// Distinct colours and the share of pixels unlike the corner's, in a PNG screenshot, decoded
// by the browser itself (the WebGL canvas cannot be read back after it is presented).
async function pixels(page, png) {
  return page.evaluate(async (b64) => {
    const img = new Image();
    img.src = "data:image/png;base64," + b64;
    await img.decode();
    const c = document.createElement("canvas");
    c.width = img.width;
    c.height = img.height;
    const g = c.getContext("2d");
    g.drawImage(img, 0, 0);
    const d = g.getImageData(0, 0, c.width, c.height).data;
    const colours = new Set();
    let unlike = 0;
    for (let i = 0; i < d.length; i += 4) {
      const rgb = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
      colours.add(rgb);
      if (rgb !== ((d[0] << 16) | (d[1] << 8) | d[2])) unlike++;
    }
    return { colours: colours.size, unlike: unlike / (d.length / 4) };
  }, png.toString("base64"));
}

// JSON with every object's keys sorted (serde_json's maps sort them, the CLI's order is the
// struct's).
const canonical = (v) => JSON.stringify(v, (_, x) =>
  x && typeof x === "object" && !Array.isArray(x)
    ? Object.fromEntries(Object.keys(x).sort().map((k) => [k, x[k]]))
    : x);

// Waits until a console line starting with `prefix` has been logged.
async function waitForLog(logs, prefix, timeoutMs) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const line = logs.find((l) => l.startsWith(prefix));
    if (line !== undefined) return line;
    if (Date.now() > end) throw new Error(`no console line "${prefix}..." within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function open(browser, fragment, extra = "") {
  const page = await browser.newPage();
  // Every animation frame's time, on the page's own clock (performance.now()).
  await page.addInitScript(() => {
    window.__frames = [];
    const tick = (t) => {
      window.__frames.push(t);
      requestAnimationFrame(tick);
    };
    requestAnimationFrame(tick);
  });
  const errors = [];
  const logs = [];
  page.on("console", (m) => {
    logs.push(m.text());
    if (m.type() === "error") errors.push(m.text());
  });
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("requestfailed", (r) => errors.push(`request failed: ${r.url()}`));
  await page.goto(env("URL") + "#config=" + encodeURIComponent(fragment) + extra);
  // The app names the parameter count in the title once its first estimate is drawn.
  await page.waitForFunction(() => / B params$/.test(document.title), null, { timeout: 120000 });
  // A few frames more, for the layout to settle.
  await page.waitForTimeout(1500);
  return { page, errors, logs };
}

// Chromium can die while it starts on a loaded machine (seen once in CI: SIGSEGV before the
// first page); the start alone is tried up to three times, each with a fresh, empty profile
// (USER_DATA_DIR, then a new folder beside it), and each failure is printed. Nothing the test
// checks is retried.
async function launch() {
  const options = {
    executablePath: "/usr/bin/chromium",
    headless: true,
    viewport: { width: 1600, height: 1000 },
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
    ],
  };
  for (let attempt = 1; ; attempt++) {
    const dir = attempt === 1
      ? env("USER_DATA_DIR")
      : require("fs").mkdtempSync(env("USER_DATA_DIR") + "-retry");
    try {
      return await chromium.launchPersistentContext(dir, options);
    } catch (e) {
      if (attempt === 3) throw e;
      console.log(`web-test: chromium did not start (try ${attempt} of 3): ${String(e).split("\n")[0]}`);
      await new Promise((r) => setTimeout(r, 2000));
    }
  }
}

(async () => {
  const browser = await launch();
  try {
    // A configuration in the URL: its parameter count in the title, the canvas drawn.
    const { page, errors, logs } = await open(browser, env("CONFIG_TOML"));
    const params = Number(env("EXPECTED_PARAMS"));
    const expected = `parsim — ${(params / 1e9).toFixed(2)} B params`;
    const title = await page.title();
    check(title === expected, `title "${title}" is "${expected}" (parsim estimate --json)`);
    const png = await page.screenshot({ path: env("SCREENSHOT") });
    const p = await pixels(page, png);
    check(p.colours > 50 && p.unlike > 0.2,
      `the canvas renders (${p.colours} colours, ${(100 * p.unlike).toFixed(0)}% of pixels unlike the corner)`);
    check(errors.length === 0, `no console errors${errors.length ? ": " + errors.join(" | ") : ""}`);
    const first = logs.find((l) => l.startsWith("parsim: first estimate at"));
    check(first !== undefined, `the page reports its first estimate: ${first}`);
    console.log(`web-test: wrote ${env("SCREENSHOT")}`);
    await page.close();

    // A malformed configuration: the CLI's field-named error, the default configuration kept.
    const bad = await open(browser, env("MALFORMED_TOML"));
    const status = await bad.page.textContent("#parsim-status");
    const cli = env("CLI_ERROR");
    const field = cli.slice(cli.indexOf("field `")).trim();
    check(status.startsWith("URL #config: ") && status.endsWith(field),
      `the page shows the CLI's error: "${status}" ends with "${field}"`);
    const badTitle = await bad.page.title();
    check(badTitle !== expected, `the default configuration stays loaded ("${badTitle}")`);
    check(bad.errors.length === 0, `no console errors${bad.errors.length ? ": " + bad.errors.join(" | ") : ""}`);

    // A search in the page: the native search's fastest mix, with frames between slices.
    const s = await open(browser, env("SEARCH_TOML"), "&search");
    const line = await waitForLog(s.logs, "parsim: search ", 300000);
    const got = JSON.parse(line.slice("parsim: search ".length));
    const want = JSON.parse(env("EXPECTED_SEARCH"));
    // The longest wait between frames while the search ran (its start and end included).
    const gap = await s.page.evaluate(([a, b]) => {
      const t = [a, ...window.__frames.filter((f) => f > a && f < b), b];
      return Math.max(...t.slice(1).map((x, i) => x - t[i]));
    }, [got.started_ms, got.ended_ms]);
    check(got.candidates === want.candidates, `the page's search covers ${got.candidates} candidates (parsim search: ${want.candidates})`);
    check(got.top && canonical(got.top.mix) === canonical(want.mix)
      && Math.abs(got.top.step_s - want.step_s) <= 1e-9 * want.step_s,
      `the page's fastest mix is parsim search's (${JSON.stringify(got.top && got.top.mix)}, ${got.top && got.top.step_s} s)`);
    console.log(`web-test: the search took ${(got.ended_ms - got.started_ms).toFixed(0)} ms in the page; longest gap between frames ${gap.toFixed(0)} ms`);
    check(gap < 1000, `frames kept coming during the search (longest gap ${gap.toFixed(0)} ms < 1000 ms)`);
    check(s.errors.length === 0, `no console errors${s.errors.length ? ": " + s.errors.join(" | ") : ""}`);
  } finally {
    await browser.close();
  }
  if (failures.length) {
    console.error(`web-test: ${failures.length} check(s) failed`);
    process.exit(1);
  }
})().catch((e) => {
  console.error(`web-test: ${e.stack || e}`);
  process.exit(1);
});
