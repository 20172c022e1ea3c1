"""Where a pip install of hbmcoll keeps its C library: `python3 -m hbmcoll.clib` prints the
folder of hbmcoll.pc, for PKG_CONFIG_PATH (then `cc prog.c $(pkg-config --cflags --libs
hbmcoll)`); `--include` and `--lib` print the header and library folders."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def pkgconfig_dir():
    return os.path.join(HERE, "lib", "pkgconfig")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    where = {"--include": os.path.join(HERE, "include"), "--lib": os.path.join(HERE, "lib")}
    path = where.get(argv[0], None) if argv else pkgconfig_dir()
    if path is None or not os.path.isdir(path):
        print(f"hbmcoll.clib: {'unknown option ' + argv[0] if path is None else path + ' is missing'}"
              " (options: --include, --lib; a build of the package puts them there)", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
