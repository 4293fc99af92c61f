/**
 * The client contract, byte for byte against the vectors the processor's own code writes
 * (schemas/vectors/client.json; AIRLOCK_VECTORS overrides the path), as
 * clients/python/tests/test_contract.py checks them for the Python client.
 */

import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";

import {
  CanonicalError,
  FenceFilter,
  MarkerVerifier,
  buildProposal,
  canonicalJson,
  canonicalize,
  codec,
  contentId,
  deriveProposalId,
  fenceMessage,
  idempotencyKey,
  loadVerifyingKey,
  murmur2,
  partitionFor,
  proposalFingerprint,
  type Header,
} from "../src/index.js";
import { PACKAGE, REPO, VECTORS_PATH, inRepository, vectors } from "./vectors.js";
// The package's test command names its files: the tests of the client's timers, reader and
// closing, and of its schema registry client (no broker needed) run with these.
import "./client.test.js";
import "./registry.test.js";

const V = vectors();

function refusal(input: string | Uint8Array): CanonicalError {
  try {
    canonicalize(input);
  } catch (e) {
    assert.ok(e instanceof CanonicalError, `a CanonicalError, not ${String(e)}`);
    return e;
  }
  assert.fail(`${JSON.stringify(String(input))} has a canonical form`);
}

describe(`the vectors at ${VECTORS_PATH}`, () => {
  test("every section is there", () => {
    for (const section of ["canonical", "partitions", "avro", "fence", "fence_signatures", "ids"]) {
      assert.ok(V[section], section);
    }
    assert.ok(V.canonical.length > 0 && V.partitions.length > 0 && V.avro.length === 3);
  });

  test("canonical forms, hashes and refusals", async (t) => {
    for (const c of V.canonical) {
      await t.test(c.name, () => {
        if ("canonical" in c) {
          const got = canonicalize(c.input);
          assert.deepEqual([got.json, got.hash], [c.canonical, c.hash]);
          // The same text as UTF-8 bytes.
          const bytes = canonicalize(Buffer.from(c.input, "utf8"));
          assert.deepEqual([bytes.json, bytes.hash], [c.canonical, c.hash]);
        } else {
          const e = refusal(c.input);
          assert.equal(e.kind, c.error);
          if (c.path !== null) {
            assert.equal(e.path, c.path);
          }
        }
      });
    }
  });

  test("key order by UTF-16 code units is not code point order", () => {
    // The reason the client sorts by code units (JavaScript's own string order) and not by
    // code points: they differ above U+FFFF.
    const c = V.canonical.find((x: { name: string }) => x.name === "utf-16 order");
    const keys = Object.keys(JSON.parse(c.input));
    const byCodePoints = [...keys].sort((a, b) => {
      const x = [...a].map((ch) => ch.codePointAt(0)!);
      const y = [...b].map((ch) => ch.codePointAt(0)!);
      for (let i = 0; i < Math.min(x.length, y.length); i++) {
        if (x[i] !== y[i]) {
          return x[i]! - y[i]!;
        }
      }
      return x.length - y.length;
    });
    const naive = "{" + byCodePoints.map((k) => `${JSON.stringify(k)}:${JSON.parse(c.input)[k]}`).join(",") + "}";
    assert.notEqual(naive, c.canonical);
    assert.equal(canonicalize(c.input).json, c.canonical);
  });

  test("partition numbers: murmur2 and the positive mask", () => {
    for (const c of V.partitions) {
      const key = Buffer.from(c.key, "utf8");
      assert.equal(murmur2(key), c.murmur2, JSON.stringify(c));
      assert.equal(partitionFor(key, c.partitions), c.partition, JSON.stringify(c));
      assert.equal(partitionFor(c.key, c.partitions), c.partition, JSON.stringify(c));
    }
    assert.ok(V.partitions.some((c: { murmur2: number }) => c.murmur2 < 0), "a negative hash is among them");
  });

  test("Avro payloads in both framings", () => {
    for (const c of V.avro) {
      const single = Buffer.from(c.single_object, "hex");
      const confluent = Buffer.from(c.confluent, "hex");
      assert.equal(codec.encode(c.record, c.value).toString("hex"), c.single_object, c.record);
      assert.equal(
        codec.encode(c.record, c.value, c.confluent_schema_id).toString("hex"),
        c.confluent,
        c.record,
      );
      assert.equal(codec.fingerprint(c.record).toString("hex"), c.single_object.slice(4, 20), c.record);
      assert.deepEqual(codec.decode(c.record, single), c.value, c.record);
      const ids = new Map([[c.confluent_schema_id as number, [c.record, 1] as const]]);
      assert.deepEqual(codec.decode(c.record, confluent, ids), c.value, c.record);
      assert.deepEqual(codec.decode(c.record, confluent, { [c.confluent_schema_id]: [c.record, 1] }), c.value);
    }
  });

  test("bad payloads are refused with a reason", () => {
    const c = V.avro.find((x: { record: string }) => x.record === "Decision");
    const single = Buffer.from(c.single_object, "hex");
    const cases: Array<[Buffer, RegExp]> = [
      [Buffer.concat([single, Buffer.from([0])]), /trailing/],
      [single.subarray(0, single.length - 3), /decode/],
      [Buffer.concat([Buffer.from([0xc3, 0x01]), Buffer.alloc(8, 0xff), single.subarray(10)]), /unknown schema fingerprint/],
      [Buffer.from("{}"), /not an Airlock payload/],
      [Buffer.from(c.confluent, "hex"), /unknown Confluent schema id/],
      [Buffer.concat([Buffer.from([0xc3, 0x01]), Buffer.alloc(codec.MAX_PAYLOAD_BYTES)]), /limit/],
    ];
    for (const [payload, why] of cases) {
      assert.throws(() => codec.decode("Decision", payload), (e: Error) => e instanceof codec.CodecError && why.test(e.message), String(why));
    }
    assert.throws(() => codec.decode("Outcome", single), /not a Outcome/);
  });

  test("the fence", () => {
    for (const c of V.fence) {
      const f = new FenceFilter();
      const got = c.records.map((r: { kind: string | null; owner_epoch: string | null }) => {
        const headers: Header[] = [];
        if (r.kind !== null) {
          headers.push(["airlock-kind", Buffer.from(r.kind)]);
        }
        if (r.owner_epoch !== null) {
          headers.push(["airlock-owner-epoch", Buffer.from(r.owner_epoch)]);
        }
        return f.admit("t", 0, headers).verdict;
      });
      assert.deepEqual(got, c.verdicts, c.name);
    }
  });

  test("signed fence markers", () => {
    const signed = V.fence_signatures;
    const verifier = new MarkerVerifier([Buffer.from(signed.verifying_key, "hex")]);
    for (const m of signed.markers) {
      const { topic, partition } = m;
      const epoch = BigInt(m.owner_epoch);
      const capability = Buffer.from(m.capability, "hex");
      assert.equal(fenceMessage(topic, partition, epoch).toString("hex"), m.message, topic);
      assert.ok(verifier.verify(topic, partition, epoch, capability), topic);
      assert.ok(!verifier.verify(topic, partition, epoch + 1n, capability), topic);
      assert.ok(!verifier.verify(topic + "x", partition, epoch, capability), topic);
      assert.ok(!verifier.verify(topic, partition, epoch, null), topic);
      assert.ok(!verifier.verify(topic, partition, epoch, Buffer.concat([Buffer.from([2]), capability.subarray(1)])), topic);
    }
    // A reader with the key: an unsigned marker of a huge epoch raises no fence, a signed one
    // does, and the answers behind it stay readable.
    const m = signed.markers[0];
    const f = new FenceFilter(verifier);
    const { topic, partition } = m;
    const epoch = String(m.owner_epoch);
    const forged: Header[] = [["airlock-kind", Buffer.from("fence")], ["airlock-owner-epoch", Buffer.from("999999")]];
    assert.equal(f.admit(topic, partition, forged).verdict, "forged");
    const genuine: Header[] = [
      ["airlock-kind", Buffer.from("fence")],
      ["airlock-owner-epoch", Buffer.from(epoch)],
      ["airlock-capability", Buffer.from(m.capability, "hex")],
    ];
    assert.equal(f.admit(topic, partition, genuine).verdict, "marker");
    const answer: Header[] = [["airlock-kind", Buffer.from("decision")], ["airlock-owner-epoch", Buffer.from(epoch)]];
    assert.equal(f.admit(topic, partition, answer).verdict, "accept");
    assert.equal(f.admit(topic, partition, [["airlock-owner-epoch", Buffer.from("4")]]).verdict, "fenced");
  });

  test("derived ids", () => {
    const ids = V.ids;
    for (const c of ids.idempotency_keys) {
      assert.equal(idempotencyKey(c.operation_key), c.idempotency_key, c.operation_key);
    }
    assert.equal(contentId("propose", ids.proposal_id.parts), ids.proposal_id.id);
    assert.equal(deriveProposalId("acme", ids.proposal_id.parts[0], ids.proposal_id.parts), ids.proposal_id.id);
    const scoped = ids.scoped_proposal_id;
    assert.equal(deriveProposalId(scoped.tenant, scoped.operation_key, scoped.parts), scoped.id);
    const fp = ids.proposal_fingerprint;
    assert.equal(proposalFingerprint(fp.proposal), fp.fingerprint);
  });

  test("a call becomes the proposal of the vectors, byte for byte", () => {
    // The ToolProposal vector, built from a call whose arguments come in another key order
    // and with whitespace: the canonical text is what goes on the wire.
    const c = V.avro.find((x: { record: string }) => x.record === "ToolProposal");
    const value = c.value;
    const call = {
      tool: value.tool,
      operationKey: value.operation_key,
      arguments: { currency: "EUR", amount_minor: 1250, account: "acct-42" },
      tenant: value.tenant_id,
      principal: value.principal_id,
      runId: value.run_id,
      logicalCallId: value.logical_call_id,
      providerCallId: value.provider_call_id,
      nowMs: value.proposed_at,
    };
    const built = buildProposal({ ...call, proposalId: value.proposal_id });
    assert.deepEqual(built, value);
    assert.equal(codec.encode("ToolProposal", { ...built }).toString("hex"), c.single_object);
    const spaced = buildProposal({
      ...call,
      arguments: ' { "currency" : "EUR", "account":"acct-42", "amount_minor": 1250 } ',
      proposalId: value.proposal_id,
    });
    assert.deepEqual(spaced, value);
    // Without an id, the id is derived from the content as `airlock propose` derives it.
    const parts = V.ids.proposal_id.parts;
    assert.equal(parts[3], value.arguments_hash);
    assert.equal(buildProposal(call).proposal_id, V.ids.proposal_id.id);
  });
});

describe("canonical rules beyond the vectors", () => {
  test("far too deep documents are refused with their path", () => {
    const e = refusal("[".repeat(10_000) + "]".repeat(10_000));
    assert.equal(e.kind, "too_deep");
    assert.equal(e.path, "/0".repeat(64));
    // Unclosed, and past what is parsed at all: the structure's scan names the place.
    const open = refusal('{"a":' + "[".repeat(5_000));
    assert.equal(open.kind, "too_deep");
    assert.equal(open.path, "/a" + "/0".repeat(63));
  });

  test("checks run in document order after the whole text parses", () => {
    // The first rule broken in document order is the one reported...
    assert.equal(refusal('[1.5, 9007199254740992]').path, "/0");
    assert.equal(refusal('[9007199254740992, 1.5]').kind, "integer_out_of_range");
    // ...a duplicate key is found before the values of its object are checked...
    assert.equal(refusal('{"a":1.5,"a":2}').kind, "duplicate_key");
    // ...and any grammar error anywhere makes it a syntax error.
    assert.equal(refusal("[1.5, }").kind, "syntax");
    assert.equal(refusal('["\\ud800", 1.5]').kind, "syntax");
    assert.equal(refusal('[1.5, "\\ud800"]').kind, "non_integer");
  });

  test("UTF-8 bytes: a BOM or invalid bytes are syntax errors", () => {
    assert.equal(refusal(Buffer.from([0xef, 0xbb, 0xbf, 0x7b, 0x7d])).kind, "syntax");
    assert.equal(refusal(Buffer.from([0x22, 0xff, 0x22])).kind, "syntax");
    assert.equal(refusal(Buffer.from([0x22, 0xed, 0xa0, 0x80, 0x22])).kind, "syntax");
    assert.equal(canonicalize(Buffer.from('"\u00e9"', "utf8")).json, '"\u00e9"');
  });

  test("JavaScript values: -0, non-finite numbers and big integers keep their meaning", () => {
    assert.equal(canonicalJson({ b: [1, "x", null, true], a: { d: 0, c: -1 } }), '{"a":{"c":-1,"d":0},"b":[1,"x",null,true]}');
    const kind = (value: unknown): string => {
      try {
        canonicalJson(value);
      } catch (e) {
        return (e as CanonicalError).kind + " " + (e as CanonicalError).path;
      }
      return "accepted";
    };
    assert.equal(kind({ a: -0 }), "non_integer /a");
    assert.equal(kind({ a: 1.5 }), "non_integer /a");
    assert.equal(kind({ a: 1e21 }), "non_integer /a");
    assert.equal(kind([Number.NaN]), "syntax (root)");
    assert.equal(kind([Infinity]), "syntax (root)");
    assert.equal(kind([2 ** 53]), "integer_out_of_range /0");
    assert.equal(kind([2n ** 53n - 1n]), "accepted");
    assert.equal(kind([-(2n ** 63n)]), "integer_out_of_range /0");
    assert.equal(kind([2n ** 64n]), "non_integer /0");
    assert.equal(kind(["\ud800"]), "syntax /0");
    assert.equal(canonicalJson({ "\ud83d\ude00": 1, "\ue000": 2 }), '{"\ud83d\ude00":1,"\ue000":2}');
  });

  test("JavaScript values that are not JSON are refused with their place, before anything is sent", () => {
    const refused = (value: unknown): string => {
      try {
        canonicalJson(value);
      } catch (e) {
        assert.ok(e instanceof CanonicalError, `a CanonicalError, not ${String(e)}`);
        return `${e.kind} ${e.path}`;
      }
      return "accepted";
    };
    class Money {
      minor = 1;
    }
    assert.equal(refused({ a: new Map([["k", 1]]) }), "syntax /a");
    assert.equal(refused({ a: [1, new Set([1])] }), "syntax /a/1");
    assert.equal(refused({ when: new Date(0) }), "syntax /when");
    assert.equal(refused({ a: { b: Buffer.from("x") } }), "syntax /a/b");
    assert.equal(refused({ a: new Uint8Array([1]) }), "syntax /a");
    assert.equal(refused({ amount: new Money() }), "syntax /amount");
    assert.equal(refused({ f: () => 1 }), "syntax /f");
    assert.equal(refused({ s: Symbol("s") }), "syntax /s");
    assert.equal(refused({ a: undefined }), "syntax /a");
    assert.equal(refused([1, undefined]), "syntax /1");
    // eslint-disable-next-line no-sparse-arrays
    assert.equal(refused([1, , 3]), "syntax /1");
    assert.equal(refused({ "a/b~": { toJSON: () => 1 } }), "syntax /a~1b~0/toJSON");
    assert.equal(refused(new Map()), "syntax (root)");
    assert.equal(refused(undefined), "syntax (root)");
    assert.match(String((() => { try { canonicalJson({ a: new Map() }); } catch (e) { return e; } })()), /a Map at \/a is not JSON/);
    // What JSON has: plain objects (also without a prototype), arrays, strings, numbers,
    // bigints, booleans and null.
    const bare = Object.assign(Object.create(null) as object, { b: 1, a: [true, null, "x", 2n] });
    assert.equal(canonicalJson(bare), '{"a":[true,null,"x",2],"b":1}');
    // buildProposal refuses them too (nothing is sent: the proposal is not built).
    const call = {
      tool: "refund",
      operationKey: "k",
      arguments: { amount: new Map([["minor_units", 1]]) },
      tenant: "t",
      principal: "p",
      runId: "r",
      logicalCallId: "c",
    };
    assert.throws(() => buildProposal(call), (e: unknown) => e instanceof CanonicalError && e.path === "/amount");
  });
});

describe("the fence beyond the vectors", () => {
  test("an owner epoch outside 64 bits is no epoch, whatever its sign", () => {
    const f = new FenceFilter();
    const h = (kind: string | null, epoch: string): Header[] =>
      kind === null ? [["airlock-owner-epoch", epoch]] : [["airlock-kind", kind], ["airlock-owner-epoch", epoch]];
    assert.equal(f.admit("t", 0, h("fence", "3")).verdict, "marker");
    assert.equal(f.admit("t", 0, h(null, "-99999999999999999999")).verdict, "accept");
    assert.equal(f.admit("t", 0, h(null, "-9223372036854775809")).verdict, "accept");
    assert.equal(f.admit("t", 0, h(null, "-9223372036854775808")).verdict, "fenced");
    assert.equal(f.admit("t", 0, h("fence", "9223372036854775808")).verdict, "accept");
    assert.equal(f.fence("t", 0), 3n);
    assert.equal(f.admit("t", 0, h("fence", "9223372036854775807")).verdict, "marker");
    assert.equal(f.fence("t", 0), 9223372036854775807n);
    // The last header of a name counts; other partitions have fences of their own.
    assert.equal(f.admit("t", 0, [["airlock-owner-epoch", "1"], ["airlock-owner-epoch", "x"]]).verdict, "accept");
    assert.equal(f.admit("t", 1, h(null, "1")).verdict, "accept");
  });

  test("verifying keys load from the files `airlock keygen` writes", () => {
    const signed = V.fence_signatures;
    const m = signed.markers[0];
    const dir = mkdtempSync(join(tmpdir(), "airlock-keys-"));
    try {
      writeFileSync(join(dir, "hex.pub"), signed.verifying_key + "\n");
      writeFileSync(join(dir, "raw.pub"), Buffer.from(signed.verifying_key, "hex"));
      writeFileSync(join(dir, "bad.pub"), "not a key\n");
      for (const file of ["hex.pub", "raw.pub"]) {
        assert.deepEqual(loadVerifyingKey(join(dir, file)), Buffer.from(signed.verifying_key, "hex"), file);
        const v = new MarkerVerifier([join(dir, "bad.pub").replace("bad", file.slice(0, 3))]);
        assert.ok(v.verify(m.topic, m.partition, BigInt(m.owner_epoch), Buffer.from(m.capability, "hex")), file);
      }
      assert.throws(() => loadVerifyingKey(join(dir, "bad.pub")), /not a verifying key/);
      // A rotation: a stranger's key beside the processor's still verifies the marker.
      const both = new MarkerVerifier([Buffer.alloc(32, 7), join(dir, "hex.pub")]);
      assert.ok(both.verify(m.topic, m.partition, m.owner_epoch, Buffer.from(m.capability, "hex")));
      assert.ok(!new MarkerVerifier([Buffer.alloc(32, 7)]).verify(m.topic, m.partition, m.owner_epoch, Buffer.from(m.capability, "hex")));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("the package's schemas", () => {
  test("are the repository's, byte for byte", { skip: !inRepository() && "not inside the Airlock repository" }, () => {
    for (const record of codec.RECORDS) {
      const ours = readdirSync(join(PACKAGE, "schemas", record)).sort();
      const theirs = readdirSync(join(REPO, "schemas/avro/history", record)).sort();
      assert.deepEqual(ours, theirs, record);
      for (const name of ours) {
        assert.deepEqual(
          readFileSync(join(PACKAGE, "schemas", record, name)),
          readFileSync(join(REPO, "schemas/avro/history", record, name)),
          `${record}/${name}`,
        );
      }
    }
  });
});
