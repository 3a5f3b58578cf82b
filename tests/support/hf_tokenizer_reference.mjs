// Hugging Face tokenizer.json encoded by the npm package @huggingface/tokenizers (tokenizers.js, a
// JavaScript implementation of the `tokenizers` library's pipeline), the independent reference for
// fasttrain's JsonTokenizer (tests/test_tokenizer_json.cpp) and the peer of bench/tokenizer.cpp.
// Nothing of it is used by the engine.
//
//   node hf_tokenizer_reference.mjs encode NODE_MODULES TOKENIZER_JSON IN.json OUT.json
//        texts (JSON list) -> ids (list of lists), add_special_tokens false
//   node hf_tokenizer_reference.mjs time NODE_MODULES TOKENIZER_JSON TEXT_FILE
//        prints {"mb_per_s": ..., "tokens": ..., "seconds": ...}
//
// NODE_MODULES is the node_modules folder the package is installed in.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

export async function load(nodeModules, tokenizerJson) {
  const { Tokenizer } = await import(pathToFileURL(path.join(nodeModules, '@huggingface/tokenizers/dist/tokenizers.mjs')).href);
  return new Tokenizer(JSON.parse(fs.readFileSync(tokenizerJson, 'utf-8')), {});
}

export function encode(tokenizer, text) {
  return tokenizer.encode(text, { add_special_tokens: false }).ids;
}

async function main() {
  const [mode, nodeModules, tokenizerJson, a, b] = process.argv.slice(2);
  if (!mode || !nodeModules || !tokenizerJson || !a) {
    console.error('usage: node hf_tokenizer_reference.mjs encode|time NODE_MODULES TOKENIZER_JSON ...');
    process.exit(2);
  }
  const tokenizer = await load(nodeModules, tokenizerJson);
  if (mode === 'encode') {
    const texts = JSON.parse(fs.readFileSync(a, 'utf-8'));
    fs.writeFileSync(b, JSON.stringify(texts.map((t) => encode(tokenizer, t))));
  } else if (mode === 'time') {
    // Pieces of about 10 kB cut at a space after a letter (where every pattern used ends a word),
    // so the time is the encoder's and not that of one huge string's bookkeeping.
    const text = fs.readFileSync(a, 'utf-8');
    const pieces = [];
    for (let at = 0; at < text.length;) {
      let cut = Math.min(text.length, at + 10000);
      while (cut < text.length && !(text[cut] === ' ' && /[A-Za-z0-9]/.test(text[cut - 1]))) cut++;
      pieces.push(text.slice(at, cut));
      at = cut;
    }
    encode(tokenizer, text.slice(0, 100000));  // warm-up (JIT, caches), as the C++ side does
    const t0 = process.hrtime.bigint();
    let tokens = 0;
    for (const p of pieces) tokens += encode(tokenizer, p).length;
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    console.log(JSON.stringify({ mb_per_s: Buffer.byteLength(text) / 1e6 / seconds, tokens, seconds }));
  } else {
    console.error(`unknown mode '${mode}'`);
    process.exit(2);
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) await main();
