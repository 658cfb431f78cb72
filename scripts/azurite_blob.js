#!/usr/bin/env node
// Azurite's blob service (the Azure Blob double the tests and the chaos harness use) with the
// garbage collection of its in-memory extents done in one pass, not one extent at a time.
//
//   node scripts/azurite_blob.js AZURITE_BLOB_MAIN_JS [azurite-blob options...]
//
// Azurite 3.37 collects unreferenced extents (every rewritten blob leaves one) 10 minutes after it
// starts and every 10 minutes after, and MemoryExtentStore.deleteExtents removes them one by one
// from a lokijs collection, each removal a filter of the whole collection and its index: quadratic,
// on Azurite's only thread. With some 100,000 extents (a chaos run's worth) it blocked every request
// for minutes, and a run past 10 minutes failed on it (loadtests/chaos/README.md). Here the same
// extents go in one removeWhere (one filter of the collection), and the chunks as before.
// `node scripts/azurite_gc_bench.js` (with the test services up: scripts/services.sh) shows both.
//
// Environment, for that bench and for tests: CORNUS_AZURITE_GC_INTERVAL_MS sets the collection's
// interval (Azurite's DEFAULT_GC_INTERVAL_MS, 600000, otherwise); CORNUS_AZURITE_GC_ONE_BY_ONE=1
// keeps Azurite's own deleteExtents; CORNUS_AZURITE_GC_LOG=1 prints each one-pass collection.
"use strict";

const fs = require("fs");
const path = require("path");

const main = process.argv[2];
if (!main || !fs.existsSync(main)) {
  console.error("usage: node scripts/azurite_blob.js AZURITE_BLOB_MAIN_JS [azurite-blob options...]");
  process.exit(2);
}
// azurite-blob is a symlink to dist/src/blob/main.js; the modules patched are beside it.
const source = path.resolve(path.dirname(fs.realpathSync(main)), "..");
const constants = require(path.join(source, "blob", "utils", "constants.js"));
const MemoryExtentStore = require(path.join(source, "common", "persistence", "MemoryExtentStore.js")).default;

const intervalMs = process.env.CORNUS_AZURITE_GC_INTERVAL_MS;
if (intervalMs !== undefined) {
  const value = Number(intervalMs);
  if (!Number.isInteger(value) || value < 1) {
    console.error(`CORNUS_AZURITE_GC_INTERVAL_MS must be a positive integer, got ${intervalMs}`);
    process.exit(2);
  }
  // Read by BlobGCManager's constructor as its default, when BlobServer makes it.
  constants.DEFAULT_GC_INTERVAL_MS = value;
}

if (process.env.CORNUS_AZURITE_GC_ONE_BY_ONE !== "1") {
  const oneByOne = MemoryExtentStore.prototype.deleteExtents;
  MemoryExtentStore.prototype.deleteExtents = async function deleteExtents(extents) {
    const metadata = this.metadataStore;
    const collection = metadata.db && metadata.db.getCollection(metadata.EXTENTS_COLLECTION);
    if (!collection) {
      return oneByOne.call(this, extents);  // not the lokijs metadata this was written for
    }
    const ids = new Set(extents);
    for (const id of ids) {
      this.chunks.delete(this.categoryName, id);
    }
    const started = Date.now();
    collection.removeWhere((doc) => ids.has(doc.id));
    if (process.env.CORNUS_AZURITE_GC_LOG === "1") {
      console.log(`azurite_blob.js: collected ${ids.size} extents in one pass in ${Date.now() - started} ms`);
    }
    return ids.size;
  };
}

// Azurite parses process.argv from its third entry on: its own options, without the path above.
process.argv.splice(2, 1);
require(main);
