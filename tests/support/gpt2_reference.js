// The JavaScript GPT-2 encoder of the npm package gpt-3-encoder (a port of OpenAI's encoder.py),
// used as an independent reference for fasttrain's Gpt2Tokenizer (tests/test_tokenizer.cpp) and
// as the peer of bench/tokenizer.cpp. Nothing of it is used by the engine.
//
//   node gpt2_reference.js encode PACKAGE_DIR IN.json OUT.json   texts (JSON list) -> ids (list of lists)
//   node gpt2_reference.js update PACKAGE_DIR CASES.json         rewrites the "ids" of each case
//   node gpt2_reference.js time PACKAGE_DIR TEXT_FILE             prints {"mb_per_s": ..., "tokens": ...}
//
// PACKAGE_DIR is the installed package (node_modules/gpt-3-encoder). Its \s is JavaScript's, which
// differs from the Unicode White_Space that GPT-2's Python regex uses for U+0085 and U+FEFF: texts
// given to it must avoid those two characters.
'use strict';
const fs = require('fs');
const path = require('path');

const [mode, pkg, a, b] = process.argv.slice(2);
if (!mode || !pkg || !a) {
  console.error('usage: node gpt2_reference.js encode|update|time PACKAGE_DIR ...');
  process.exit(2);
}
const encoder = require(path.resolve(pkg));

if (mode === 'encode') {
  const texts = JSON.parse(fs.readFileSync(a, 'utf-8'));
  fs.writeFileSync(b, JSON.stringify(texts.map((t) => encoder.encode(t))));
} else if (mode === 'update') {
  const doc = JSON.parse(fs.readFileSync(a, 'utf-8'));
  for (const c of doc.cases) c.ids = encoder.encode(c.text);
  const lines = doc.cases.map((c) => '  ' + JSON.stringify(c));
  const head = Object.entries(doc).filter(([k]) => k !== 'cases').map(([k, v]) => JSON.stringify(k) + ': ' + JSON.stringify(v));
  fs.writeFileSync(a, '{' + head.join(',\n ') + ',\n "cases": [\n' + lines.join(',\n') + '\n]}\n');
} else if (mode === 'time') {
  // encode() grows its result with Array.concat per word, which is quadratic in the text's length
  // (a 4 MB text would take hours), so the text is encoded in pieces of about 10 kB cut where
  // GPT-2's pattern ends a word anyway (a space or newline after a printable ASCII character):
  // the tokens are the same as one call's, and the time is the encoder's, not the copying's.
  const text = fs.readFileSync(a, 'utf-8');
  const pieces = [];
  for (let at = 0; at < text.length;) {
    let cut = Math.min(text.length, at + 10000);
    while (cut < text.length && !(/[ \n]/.test(text[cut]) && /[!-~]/.test(text[cut - 1]))) cut++;
    pieces.push(text.slice(at, cut));
    at = cut;
  }
  encoder.encode(text.slice(0, 100000));  // warm-up (JIT, word cache), as the C++ side does
  const t0 = process.hrtime.bigint();
  let tokens = 0;
  for (const p of pieces) tokens += encoder.encode(p).length;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({mb_per_s: Buffer.byteLength(text) / 1e6 / seconds, tokens, seconds}));
} else {
  console.error('unknown mode ' + mode);
  process.exit(2);
}
