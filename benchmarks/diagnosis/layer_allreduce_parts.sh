#!/usr/bin/env bash
# Why does the layer probe time a 14 KiB all-reduce part at ~30 µs on 2 × H200 when the allreduce probe says ~12 µs?
# The part alone, with a norm, and after FP8 GEMMs (rotated or not). Results under $OUT/l.tgz.
source "$(dirname "$0")/../campaigns/campaign_lib.sh"
W=/tmp/lw; mkdir -p $W
AR='1*allreduce:collective=all_reduce,bytes=14336,ranks=2,dtype=bf16'
G1='1*gemm:m=1,n=18432,k=7168,batch=1,dtype=fp8'
G2='1*gemm:m=1,n=7168,k=9216,batch=1,dtype=fp8'
N='1*norms:op=add_rmsnorm,tokens=1,width=7168,dtype=bf16'
P="python3 -m decodetop probe"
timeout 60 $P allreduce --sizes 14336 --set allreduce.modes=graph,pipelined --json $W/ar.json > $W/ar.txt 2>&1
timeout 60 $P layer --set "layer.dense_ops=[\"$AR\"]" --set 'layer.moe_ops=[]' --json $W/l_ar.json > $W/l_ar.txt 2>&1
timeout 60 $P layer --set "layer.dense_ops=[\"$AR\",\"$N\"]" --set 'layer.moe_ops=[]' --json $W/l_arn.json > $W/l_arn.txt 2>&1
timeout 90 $P layer --set "layer.dense_ops=[\"$G1\",\"$AR\",\"$G2\",\"$AR\",\"$N\"]" --set 'layer.moe_ops=[]' --json $W/l_gar.json > $W/l_gar.txt 2>&1
timeout 90 $P layer --set "layer.dense_ops=[\"$G1\",\"$AR\",\"$G2\",\"$AR\",\"$N\"]" --set 'layer.moe_ops=[]' --set layer.rotate=false --json $W/l_gar_norot.json > $W/l_gar_norot.txt 2>&1
tar czf $OUT/l.tgz -C $W .
python3 - <<'PY'
import json, glob, statistics
for f in sorted(glob.glob('/tmp/lw/*.json')):
    try: d=json.load(open(f))
    except Exception as e: print(f, 'bad', e); continue
    for r in d.get('results', []):
        for m in r['measurements']:
            p=m['params']
            if r['probe']=='allreduce' or 'allreduce' in str(p.get('key','')) or p.get('role') in ('layer','composition'):
                per=[ (round(statistics.median(x['samples']),1) if x.get('samples') else None) for x in m['per_rank']]
                print(f.split('/')[-1], m['name'][:70], p.get('method',''), per, {k: round(v,1) for k,v in (m.get('metrics') or {}).items() if k in ('time_us','error_pct','sum_parts_us','layer_us')}, (m.get('note') or '')[:80])
PY
tail -3 /tmp/lw/l_gar.txt
