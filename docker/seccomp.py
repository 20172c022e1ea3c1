#!/usr/bin/env python3
"""Write a seccomp profile that decides the NUMA memory-policy system calls.

    python3 docker/seccomp.py --docker-like   [IN] > docker-like.json
    python3 docker/seccomp.py --allow-mempolicy [IN] > hbm.json

IN is a Docker/OCI seccomp profile (default: podman's /usr/share/containers/seccomp.json; for
Docker use moby's profiles/seccomp/default.json). The calls are mbind, set_mempolicy,
get_mempolicy, move_pages (and set_mempolicy_home_node, migrate_pages).

--docker-like      as Docker's default profile: allowed only with CAP_SYS_NICE, else EPERM. Under
                   podman (whose own profile allows them) this reproduces what a Docker user sees:
                   `--security-opt seccomp=FILE` refuses mbind, `--cap-add SYS_NICE` allows it.
--allow-mempolicy  allowed without CAP_SYS_NICE: for Docker hosts where adding SYS_NICE (which
                   also lets the container raise priorities) is not wanted:
                   `docker run --security-opt seccomp=hbm.json ...`.
"""
import json
import sys

MEMPOLICY = ["mbind", "set_mempolicy", "get_mempolicy", "move_pages", "set_mempolicy_home_node",
             "migrate_pages"]


def rewrite(profile, mode):
    rules = []
    for rule in profile.get("syscalls", []):
        names = [n for n in rule.get("names", []) if n not in MEMPOLICY]
        if "name" in rule and rule["name"] in MEMPOLICY:
            continue
        if names or "name" in rule:
            rule = dict(rule)
            if "names" in rule:
                rule["names"] = names
            rules.append(rule)
    if mode == "docker-like":
        rules.append({"names": MEMPOLICY, "action": "SCMP_ACT_ALLOW",
                      "includes": {"caps": ["CAP_SYS_NICE"]}})
        rules.append({"names": MEMPOLICY, "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
                      "excludes": {"caps": ["CAP_SYS_NICE"]}})
    else:
        rules.append({"names": MEMPOLICY, "action": "SCMP_ACT_ALLOW"})
    out = dict(profile)
    out["syscalls"] = rules
    return out


def main(argv):
    modes = {"--docker-like": "docker-like", "--allow-mempolicy": "allow"}
    if not argv or argv[0] not in modes or len(argv) > 2:
        sys.exit(__doc__)
    src = argv[1] if len(argv) > 1 else "/usr/share/containers/seccomp.json"
    with open(src) as f:
        profile = json.load(f)
    json.dump(rewrite(profile, modes[argv[0]]), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
