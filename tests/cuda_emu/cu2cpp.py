"""cu2cpp.py FILE.cu > FILE.cpp: rewrites CUDA source for the CPU emulator.

kernel<<<grid, block[, smem]>>>(args)  ->  (emu_check_launch("kernel", args),
                                           emu_launch("kernel", [&] { kernel(args); }, grid, block[, smem]))
extern __shared__ T name[];            ->  T *name = (T *)emu_dynamic_shared();
__shared__ T a[N], b[M];               ->  static T a[N], b[M]; EMU_SHARED(a); EMU_SHARED(b);
                                           (blocks run one at a time, so a function's statics
                                           are the block's shared memory; EMU_SHARED makes them
                                           NaN at the start of every block)
"""
import re
import sys

source = open(sys.argv[1]).read()
out, at = [], 0
launch = re.compile(r'(\b\w+)\s*<<<(.*?)>>>\s*\(', re.S)
while (m := launch.search(source, at)):
    end, depth = m.end(), 1  # the arguments run to the matching parenthesis
    while depth:
        depth += {'(': 1, ')': -1}.get(source[end], 0)
        end += 1
    out.append(source[at:m.start()])
    kernel, args = m.group(1), source[m.end():end - 1]
    checked = ', ' + ' '.join(args.split()) if args.strip() else ''  # on one line: the #line numbers hold
    out.append('(emu_check_launch("%s"%s), emu_launch("%s", [&] { %s(%s); }, %s))'
               % (kernel, checked, kernel, kernel, args, m.group(2)))
    at = end
out.append(source[at:])
source = ''.join(out)
source = re.sub(r'extern\s+__shared__\s+(\w+)\s+(\w+)\s*\[\s*\]\s*;', r'\1 *\2 = (\1 *)emu_dynamic_shared();', source)
source = re.sub(r'__shared__\s+(\w+)\s+([^;]+);',
                lambda m: 'static %s %s; %s' % (m.group(1), m.group(2),
                                                 ' '.join('EMU_SHARED(%s);' % name
                                                          for name in re.findall(r'(\w+)\s*\[', m.group(2)))),
                source)
sys.stdout.write('#line 1 "%s"\n%s' % (sys.argv[1], source))
