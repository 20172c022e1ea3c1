/*
 * test_nodes_sha256.c - SHA-256 and HMAC-SHA256 of the rendezvous of nodes (nodes_sha256.c)
 * against FIPS 180-4's and RFC 4231's vectors: short, multi-block (a million 'a'), a key longer
 * than a block, and a message given in parts (the proofs hash several parts).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nodes.h"

static int failed, passed;

static void expect(const char *name, const uint8_t got[32], const char *hex) {
  char text[65];
  for (int i = 0; i < 32; i++) snprintf(text + 2 * i, 3, "%02x", got[i]);
  int ok = strcmp(text, hex) == 0;
  ok ? passed++ : failed++;
  printf("%s %-44s%s%s\n", ok ? "ok  " : "FAIL", name, ok ? "" : " got ", ok ? "" : text);
}

int main(void) {
  uint8_t out[32];
  coll__sha256("abc", 3, out);
  expect("sha256 abc", out, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  coll__sha256("", 0, out);
  expect("sha256 empty", out, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  coll__sha256(two, strlen(two), out);
  expect("sha256 two blocks", out, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  char *million = malloc(1000000);
  memset(million, 'a', 1000000);
  coll__sha256(million, 1000000, out);
  expect("sha256 a million a", out, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  free(million);
  const void *parts[2] = {"what do ya ", "want for nothing?"};
  size_t lens[2] = {11, 17};
  coll__hmac_sha256((const uint8_t *)"Jefe", 4, parts, lens, 2, out);
  expect("hmac rfc4231 case 2, in two parts", out, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  uint8_t key[131];
  memset(key, 0xaa, sizeof key);
  const void *one[1] = {"Test Using Larger Than Block-Size Key - Hash Key First"};
  size_t len1[1] = {54};
  coll__hmac_sha256(key, sizeof key, one, len1, 1, out);
  expect("hmac rfc4231 case 6, key over a block", out, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  printf("%d passed, %d failed\n", passed, failed);
  return failed != 0;
}
