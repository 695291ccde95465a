// Session 21 probe (AMD EPYC, 2 cores): one-row tile streaming of 538 MB with software prefetch variants,
// interleaved with a 1 GB sum. Build and run: gcc -O3 -fopenmp -march=native stream_tiles.c -o st && ./st
// Columns: h<hint: 1 = T1 (L2), 2 = T2, 0 = T0> a<KB ahead> GB/s. Outputs of the session's two runs: stream_tiles.txt
// GEMV-like streaming: tiles of 32 outputs x K=576 floats, 1 row; variants of software prefetch.
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define TILE 32
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx512f,fma")))
static void tile1(const float* wp, const float* x, long K, float* y, const char* pf, const char* pfend, long pstep, int hint){
  __m512 a0=_mm512_setzero_ps(), a1=_mm512_setzero_ps();
  for(long k=0;k<K;++k){
    if(pf<pfend){ if(hint==1){_mm_prefetch(pf,_MM_HINT_T1); _mm_prefetch(pf+64,_MM_HINT_T1);} else if(hint==0){_mm_prefetch(pf,_MM_HINT_T0); _mm_prefetch(pf+64,_MM_HINT_T0);} else if(hint==2){_mm_prefetch(pf,_MM_HINT_T2); _mm_prefetch(pf+64,_MM_HINT_T2);} else {_mm_prefetch(pf,_MM_HINT_NTA); _mm_prefetch(pf+64,_MM_HINT_NTA);} pf+=pstep;}
    __m512 w0=_mm512_loadu_ps(wp+k*TILE), w1=_mm512_loadu_ps(wp+k*TILE+16);
    __m512 b=_mm512_set1_ps(x[k]);
    a0=_mm512_fmadd_ps(b,w0,a0); a1=_mm512_fmadd_ps(b,w1,a1);
  }
  _mm512_storeu_ps(y,a0); _mm512_storeu_ps(y+16,a1);
}
int main(int argc,char**argv){
  long K=576, bytes=538L<<20; long ntiles=bytes/(K*TILE*4);
  float* W=aligned_alloc(64,ntiles*K*TILE*4); for(long i=0;i<ntiles*K*TILE;i++)W[i]=1e-3f*(i%7);
  float* x=aligned_alloc(64,K*4); for(int i=0;i<K;i++)x[i]=1;
  float* y=aligned_alloc(64,ntiles*TILE*4);
  float* S=aligned_alloc(64,1L<<30); memset(S,1,1L<<30);
  long aheads[]={0,1024,2048,4096,8192,73728}; int hints[]={1,2,0};
  for(int rep=0;rep<6;rep++){
    // plain sum
    double t=now(); double tot=0;
    #pragma omp parallel for reduction(+:tot) num_threads(2)
    for(long i=0;i<(1L<<28);i+=16){ __m512 v=_mm512_load_ps(S+i); tot+=_mm512_reduce_add_ps(v);}  
    double ts=now()-t; printf("rep %d sum %.1f GB/s |",rep,(1L<<30)/ts/1e9);
    for(int h=0;h<3;h++) for(int a=0;a<6;a++){ if(aheads[a]==0 && h>0) continue;
      long ahead=aheads[a]; double best=1e9;
      for(int it=0;it<3;it++){ double t0=now();
        #pragma omp parallel num_threads(2)
        { int tid=omp_get_thread_num(); long lo=ntiles*tid/2, hi=ntiles*(tid+1)/2;
          const char* end=(const char*)(W+hi*K*TILE);
          for(long tt=lo;tt<hi;tt++){ const float* wp=W+tt*K*TILE; const char* pf=(const char*)wp+ahead;
            tile1(wp,x,K,y+tt*TILE, ahead? pf: end, end, 128, hints[h]); } }
        double e=now()-t0; if(e<best)best=e; }
      printf(" h%d a%.0f %.1f", hints[h], ahead/1024.0, ntiles*K*TILE*4/best/1e9);
    }
    printf("\n"); fflush(stdout);
  }
}
