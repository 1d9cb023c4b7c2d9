// Drives OpenClaw's own compiled session-state code for the interop check.
//
// usage: node openclaw_driver.mjs <openclaw package dir> <ops.json>
//
// ops.json is a list of {"fn": exportedName, "args": [...]} calls, run in order; a call's
// result is printed as one line "@@RESULT <json>" (errors as {"error": message}). Two
// pseudo-functions read the database directly: "schemaIssues" (OpenClaw's own schema check,
// limited to the session-state tables) and "rows" (a read-only query). A call with
// "repeat": N runs N times, one after the other, and its result is
// {"elapsed_ms": <the N calls, timed here>, "last": <the last call's result>}
// (bench/kernel.py times OpenClaw's recording with it, without Node's start-up). A call with
// "each": [[args], ...] runs once per argument list and its result is {"ms": [each call's
// time], "last": <the last call's result>} (bench/openclaw_side.py takes percentiles of it);
// with "keep": true, "all" holds every call's result too.
//
// The package's chunks have hashed names, so functions are found by the names they are
// exported under; nothing of OpenClaw's is copied into this repository.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { DatabaseSync } from "node:sqlite";

const SESSION_TABLES = new Set([
  "session_state_events",
  "session_state_heads",
  "session_watch_cursors",
  "session_upstream_links",
]);

async function loadExports(dist, names) {
  const wanted = new Set(names);
  const found = new Map();
  for (const file of fs.readdirSync(dist).sort()) {
    if (!file.endsWith(".mjs") || found.size === wanted.size) continue;
    const text = fs.readFileSync(path.join(dist, file), "utf8");
    const match = text.match(/export \{([^}]*)\};?\s*$/);
    if (!match) continue;
    for (const part of match[1].split(",")) {
      const [original, alias] = part.trim().split(/\s+as\s+/);
      if (wanted.has(original) && !found.has(original)) found.set(original, [file, alias ?? original]);
    }
  }
  const out = {};
  for (const [name, [file, alias]] of found) {
    const mod = await import(pathToFileURL(path.join(dist, file)).href);
    out[name] = mod[alias];
  }
  const missing = names.filter((n) => out[n] === undefined);
  if (missing.length) throw new Error(`not exported by this openclaw package: ${missing.join(", ")}`);
  return out;
}

function jsonable(value) {
  return JSON.parse(JSON.stringify(value ?? null, (_, v) => (typeof v === "bigint" ? Number(v) : v)));
}

const [packageDir, opsFile] = process.argv.slice(2);
const ops = JSON.parse(fs.readFileSync(opsFile, "utf8"));
const names = [...new Set(ops.map((op) => op.fn).filter((fn) => fn !== "rows"))];
if (names.includes("schemaIssues")) names.push("collectSqliteSchemaIssues", "OPENCLAW_STATE_SCHEMA_SQL");
const fns = await loadExports(
  path.join(packageDir, "dist"),
  names.filter((n) => n !== "schemaIssues"),
);

for (const op of ops) {
  let result;
  try {
    if (op.fn === "schemaIssues" || op.fn === "rows") {
      const db = new DatabaseSync(op.args[0], { readOnly: true });
      try {
        result =
          op.fn === "rows"
            ? db.prepare(op.args[1]).all(...(op.args[2] ?? []))
            : fns
                .collectSqliteSchemaIssues(db, fns.OPENCLAW_STATE_SCHEMA_SQL)
                .filter((issue) => SESSION_TABLES.has(String(issue.objectName ?? "").split(".")[0]));
      } finally {
        db.close();
      }
    } else if (op.each) {
      // one call per argument list in op.each, each timed: {"ms": [...], "last": ...}
      const ms = [];
      const all = [];
      let last;
      for (const args of op.each) {
        const started = process.hrtime.bigint();
        last = await fns[op.fn](...args);
        ms.push(Number(process.hrtime.bigint() - started) / 1e6);
        if (op.keep) all.push(last);
      }
      result = op.keep ? { ms, last, all } : { ms, last };
    } else if (op.repeat) {
      const started = process.hrtime.bigint();
      let last;
      for (let i = 0; i < op.repeat; i++) last = await fns[op.fn](...(op.args ?? []));
      result = { elapsed_ms: Number(process.hrtime.bigint() - started) / 1e6, last };
    } else {
      result = await fns[op.fn](...(op.args ?? []));
    }
  } catch (error) {
    result = { error: String(error?.message ?? error) };
  }
  process.stdout.write(`@@RESULT ${JSON.stringify(jsonable(result))}\n`);
}
