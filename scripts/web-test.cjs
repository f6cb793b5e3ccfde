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

async function open(browser, fragment) {
  const page = await browser.newPage();
  const errors = [];
  const logs = [];
  page.on("console", (m) => {
    logs.push(m.text());
    if (m.type() === "error") errors.push(m.text());
  });
  page.on("pageerror", (e) => errors.push(String(e)));
  page.on("requestfailed", (r) => errors.push(`request failed: ${r.url()}`));
  await page.goto(env("URL") + "#config=" + encodeURIComponent(fragment));
  // The app names the parameter count in the title once its first estimate is drawn.
  await page.waitForFunction(() => / B params$/.test(document.title), null, { timeout: 120000 });
  // A few frames more, for the layout to settle.
  await page.waitForTimeout(1500);
  return { page, errors, logs };
}

(async () => {
  // A fresh profile (USER_DATA_DIR, empty) for every run.
  const browser = await chromium.launchPersistentContext(env("USER_DATA_DIR"), {
    executablePath: "/usr/bin/chromium",
    headless: true,
    viewport: { width: 1600, height: 1000 },
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
    ],
  });
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
